"""Default schedules for kernels that have no tuning record, as dlight schedule rules.

Without a schedule TVM emits naive serial loops on CPU (ResNet-50: seconds instead of
milliseconds) and kernels that do not build at all on a GPU, so every PrimFunc gets one here.
``RULES`` is the one list of rules: each is a dlight ``ScheduleRule`` that answers None for a
kernel it does not fit, the ones available for the target are tried in order and the first
schedule wins (``dl.ApplyDefaultSchedule``). Each kernel is labelled with its rule's name here and
nowhere else; ``report()["schedules"]`` counts the labels beside the tuned kernels.

A new rule (matmul, depthwise, Winograd, ...) is a file of its own in ``schedules/cpu/`` (or a TVM
rule for GPUs), placed in ``RULES`` before the rules it should take kernels from.
"""

from __future__ import annotations

import collections
from typing import Callable

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

from relaxc.passes.ir import IS_SCHEDULED, SCHEDULE_ATTR
from relaxc.schedules import cpu


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


def default_schedule(func: tirx.PrimFunc, target: Target) -> tuple[s_tir.Schedule, str]:
    """The schedule the first fitting rule gives ``func`` (with its trace, which tuning records
    replay), and that rule's label."""
    for label, rule in rules(target):
        sch = rule.apply(func, target, False)
        if sch is not None:
            return sch, label
    raise ValueError(f"no default schedule rule fits this kernel on {target.kind.name}")


class _Labelled(dl.ScheduleRule):
    """A rule whose schedules carry its label in ``SCHEDULE_ATTR``."""

    def __init__(self, label: str, rule: dl.ScheduleRule) -> None:
        self.label = label
        self.rule = rule

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        sch = self.rule.apply(func, target, tunable)
        if sch is None:
            return None
        return s_tir.Schedule(sch.mod["main"].with_attr(SCHEDULE_ATTR, self.label))


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
        labelled = [_Labelled(label, rule) for label, rule in rules(self.target)]
        mod = dl.ApplyDefaultSchedule(*labelled)(mod.clone())
        kinds = [schedule_kind(f) for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
        self.counts = dict(sorted(collections.Counter(kinds).items()))
        return mod
