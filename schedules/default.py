"""Default schedules for kernels that have no tuning record, as dlight schedule rules.

Without a schedule TVM emits naive serial loops on CPU (ResNet-50: seconds instead of
milliseconds) and kernels that do not build at all on a GPU, so every PrimFunc gets one here.
``RULES`` is the one list of rules: each is a dlight ``ScheduleRule`` that answers None for a
kernel it does not fit, the ones available for the target are tried in order and the first
schedule wins (``dl.ApplyDefaultSchedule``). Any error a rule raises is a bug and fails the compile
(``ScheduleRuleError``, naming the rule and the kernel), never a quiet fall to a slower rule. Each
kernel is labelled with its rule's name here and nowhere else; ``report()["schedules"]`` counts
the labels beside the tuned kernels.

A new rule (matmul, depthwise, Winograd, ...) is a file of its own in ``schedules/cpu/`` (or a TVM
rule for GPUs), placed in ``RULES`` before the rules it should take kernels from.
"""

from __future__ import annotations

import collections
import logging
from typing import Callable

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

from relaxc.passes.ir import IS_SCHEDULED, SCHEDULE_ATTR, at_sizes, is_dynamic
from relaxc.passes.memory import main_bounds
from relaxc.schedules import cpu
from relaxc.schedules.dynamic import DoesNotReplay, on_dynamic, representative_sizes
from relaxc.support.errors import ScheduleRuleError, message
from relaxc.support.targets import dynamic_multiple


log = logging.getLogger("relaxc")

# (label, rule factory), in the order the rules are tried
RULES: tuple[tuple[str, Callable[[], dl.ScheduleRule]], ...] = (
    ("int8", cpu.Int8),
    ("winograd", cpu.Winograd),
    ("dense", cpu.Dense),
    ("rows", cpu.Rows),
    ("tiled", cpu.Tiled),
    ("basic", cpu.Basic),
    ("gpu-matmul", dl.gpu.Matmul),
    ("gpu-gemv", dl.gpu.GEMV),
    ("gpu-reduction", dl.gpu.Reduction),
    ("gpu-general-reduction", dl.gpu.GeneralReduction),
    ("gpu-fallback", dl.gpu.Fallback),  # binds whatever is left (convs included) to threads
)


def rules(target: Target) -> list[tuple[str, dl.ScheduleRule]]:
    """The labelled rules available for ``target``, in order."""
    available = [(label, factory()) for label, factory in RULES]
    return [(label, rule) for label, rule in available if rule.is_target_available(target)]


def default_schedule(func: tirx.PrimFunc, target: Target,
                     sizes: dict[str, int] | None = None) -> tuple[s_tir.Schedule, str]:
    """The schedule the first fitting rule gives ``func`` (with its trace, which tuning records
    replay; a kernel of dynamic extents as at ``sizes``, ``replayed``), and that rule's label."""
    for label, rule in rules(target):
        sch = _scheduled(rule, func, target, False, sizes, str((func.attrs or {}).get("global_symbol", "")))
        if sch is not None:
            return sch, label
    raise ValueError(f"no default schedule rule fits this kernel on {target.kind.name}")


def _scheduled(rule: dl.ScheduleRule, func: tirx.PrimFunc, target: Target, tunable: bool,
               sizes: dict[str, int] | None, kernel: str = "") -> s_tir.Schedule | None:
    """``rule``'s schedule of ``func``: replayed from ``sizes`` where its extents are dynamic and
    the trace applies there, else its own. A rule says a kernel is not its by answering None; any
    error it raises is a bug, reported as ``ScheduleRuleError`` naming the rule and ``kernel``."""
    try:
        sch = replayed(rule, func, target, sizes) if sizes and is_dynamic(func) else None
        return sch or rule.apply(func, target, tunable)
    except Exception as err:  # noqa: BLE001 - re-raised, naming the kernel and the rule
        raise ScheduleRuleError(f"the {type(rule).__name__} schedule rule failed on kernel {kernel or '(unnamed)'}: "
                                f"{type(err).__name__}: {message(err)}") from err


class _Labelled(dl.ScheduleRule):
    """A rule whose schedules carry its label in ``SCHEDULE_ATTR``; a kernel of dynamic extents
    gets the schedule the rule gives it at ``sizes`` (``replayed``)."""

    def __init__(self, label: str, rule: dl.ScheduleRule, sizes: dict[str, int] | None = None,
                 names: dict[tirx.PrimFunc, str] | None = None) -> None:
        self.label = label
        self.rule = rule
        self.sizes = sizes or {}
        self.names = names or {}  # each kernel's name in its module, for errors

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        sch = _scheduled(self.rule, func, target, tunable, self.sizes, self.names.get(func, ""))
        if sch is None:
            return None
        return s_tir.Schedule(sch.mod["main"].with_attr(SCHEDULE_ATTR, self.label))


def replayed(rule: dl.ScheduleRule, func: tirx.PrimFunc, target: Target, sizes: dict[str, int]) -> s_tir.Schedule | None:
    """``func`` (of dynamic extents) scheduled as ``rule`` schedules it with each dynamic dim at its
    size in ``sizes``, its trace applied exactly (``dynamic.on_dynamic``); None if the rule takes
    no such kernel, its trace does not apply, or a buffer is empty at ``sizes`` (a dim that is the
    difference of two others)."""
    fixed = at_sizes(func, sizes)
    if any(isinstance(d, tirx.IntImm) and int(d) <= 0 for param in fixed.params
           if isinstance(param.ty, tirx.BufferType) for d in param.ty.shape):
        return None
    static = rule.apply(fixed, target, False)
    if static is None:
        return None
    try:
        return on_dynamic(static.trace, func)
    except DoesNotReplay as err:
        log.debug("%s schedule does not replay on dynamic extents: %s", type(rule).__name__, err)
    return None


def schedule_kind(func: tirx.PrimFunc) -> str:
    """A kernel's schedule: its rule's label, "tuned" (a tuning record), or "none"."""
    attrs = func.attrs or {}
    if SCHEDULE_ATTR in attrs:
        return str(attrs[SCHEDULE_ATTR])
    return "tuned" if attrs.get(IS_SCHEDULED) else "none"


@tvm.transform.module_pass(opt_level=0, name="relaxc.DefaultSchedules")
class DefaultSchedules:
    """Schedule every kernel that is not scheduled yet (tuned ones are left alone) with the first
    fitting rule of ``RULES``; ``summary()`` counts the kernels of each kind."""

    report_key = "schedules"

    def __init__(self, target: Target) -> None:
        self.target = target
        self.counts: dict[str, int] = {}

    def summary(self) -> dict:
        return self.counts

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        sizes = representative_sizes(main_bounds(mod), dynamic_multiple(self.target))
        mod = mod.clone()
        names = {func: gvar.name_hint for gvar, func in mod.functions_items() if isinstance(func, tirx.PrimFunc)}
        labelled = [_Labelled(label, rule, sizes, names) for label, rule in rules(self.target)]
        mod = dl.ApplyDefaultSchedule(*labelled)(mod)
        kinds = [schedule_kind(f) for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
        self.counts = dict(sorted(collections.Counter(kinds).items()))
        return mod
