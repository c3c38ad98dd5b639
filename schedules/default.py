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
import math
import logging
from typing import Callable

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

from relaxc.passes.ir import IS_SCHEDULED, SCHEDULE_ATTR, at_sizes, is_dynamic
from relaxc.passes.memory import main_bounds
from relaxc.schedules import cpu
from relaxc.support.targets import dynamic_multiple
from relaxc.support.tvm_internals import UncheckedSchedule
from tvm.sym.analyzer import Analyzer


log = logging.getLogger("relaxc")
ROW_MULTIPLE = 8  # dynamic query rows are padded to register tiles of 8 (passes/attention.py)
PARALLEL_ITERATIONS = 4  # a dynamic kernel's parallel loop has at least these at every size (2 threads)
ATTACHING = {"ComputeAt", "ReverseComputeAt"}  # a block attached under a parallel loop computes its whole range

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
    """A rule whose schedules carry its label in ``SCHEDULE_ATTR``; a kernel of dynamic extents
    gets the schedule the rule gives it at ``sizes`` (``replayed``)."""

    def __init__(self, label: str, rule: dl.ScheduleRule, sizes: dict[str, int] | None = None) -> None:
        self.label = label
        self.rule = rule
        self.sizes = sizes or {}

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        sch = replayed(self.rule, func, target, self.sizes) if self.sizes and is_dynamic(func) else None
        sch = sch or self.rule.apply(func, target, tunable)
        if sch is None:
            return None
        return s_tir.Schedule(sch.mod["main"].with_attr(SCHEDULE_ATTR, self.label))


def _check_split(sch: s_tir.Schedule, inst, inputs: list, inexact: list[str]) -> None:
    """Note in ``inexact`` a split or partition of a dynamic extent that its factors do not divide
    (the analyzer proves ``(s + 15) // 16 * 16`` a multiple of 16; a bare ``s`` is a multiple of
    nothing). The compute-at bound tests TVM adds where it cannot prove a fused loop's range under
    dynamic extents stay: at exact splits they hold wherever they do at the static size."""
    if inst.kind.name not in ("Split", "LoopPartition"):
        return
    extent = sch.get(inputs[0]).extent
    if isinstance(extent, tirx.IntImm):
        return
    factors = [int(f) for f in inputs[1:] if isinstance(f, (int, tirx.IntImm))]
    whole = math.prod(factors) if inst.kind.name == "Split" else None
    if whole is None or not Analyzer().can_prove(tirx.floormod(extent, whole) == 0):
        inexact.append(f"{inst.kind.name} of {extent} by {factors}")


def _at_size_one(extent: tirx.PrimExpr) -> int:
    """An extent with every dynamic dim at 1: its smallest value."""
    analyzer = Analyzer()
    for var in tirx.analysis.undefined_vars(extent):
        analyzer.bind(var, tirx.const(1, var.ty.dtype))
    return int(analyzer.simplify(extent))


def _parallel_prefix(sch: s_tir.Schedule, inst, inputs: list) -> int | None:
    """How many leading loops a Fuse of a dynamic kernel's loops keeps fused, the rest nested
    serially inside: the fewest that give ``PARALLEL_ITERATIONS`` at every size. A fused loop
    indexes each loop it fuses by dividing by the extents of those after it, per iteration: by a
    dynamic one that LLVM cannot turn into a multiply (BERT's keys padded and transposed, 16 floats
    per iteration: ~ 3x the static copy's time). None: all of them (no dynamic extent after the
    first)."""
    if inst.kind.name != "Fuse":
        return None
    loops = [sch.get(rv) for rv in inputs]
    if all(isinstance(loop.extent, tirx.IntImm) for loop in loops[1:]):
        return None
    iterations = 1
    for kept, loop in enumerate(loops[:-1], start=1):
        iterations *= _at_size_one(loop.extent)
        if iterations >= PARALLEL_ITERATIONS:
            return kept
    return None


def _fused_prefixes(trace: s_tir.schedule.Trace, prefixes: dict[int, int]) -> s_tir.schedule.Trace:
    """``trace`` with the Fuse at each position of ``prefixes`` fusing only that many loops."""
    insts = [s_tir.schedule.Instruction(inst.kind, list(inst.inputs)[:prefixes[i]], inst.attrs, inst.outputs)
             if i in prefixes else inst for i, inst in enumerate(trace.insts)]
    return s_tir.schedule.Trace(insts, {insts[i]: d for i, inst in enumerate(trace.insts)
                                        if (d := trace.decisions.get(inst)) is not None})


def _dynamic_vectors(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` vectorises a loop of dynamic extent (a loop whose extent was one vector at
    the representative size: LLVM code has no vector of dynamic length)."""
    found = []
    tvm_ffi.structural_map(func.body, (tirx.For, lambda loop: found.append(
        loop.kind == tirx.ForKind.VECTORIZED and not isinstance(loop.extent, tirx.IntImm)) or loop))
    return any(found)


def _prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))


def representative_sizes(bounds: dict[str, int], multiple: int = 32) -> dict[str, int]:
    """The size each dynamic dim is scheduled at: a prime q just below ``multiple`` times p, p a
    prime of at least 11 about bound / ``multiple`` (384 at 32: 409, 32 x 13 = 416). The rules tile
    an extent by its factors: a bare dim (q) then has none, and one padded to whole multiples (keys,
    ``dynamic_multiple``) or register tiles of 8 rows (queries), which is ``multiple`` p, has those
    of the padding's multiple alone, which divides it at every size."""
    def size(bound: int) -> int:
        p = max(11, -(-bound // multiple))
        while True:
            whole = multiple * p
            q = next((q for q in range(whole, whole - ROW_MULTIPLE, -1) if _prime(q)), None)
            if _prime(p) and q is not None:
                return q
            p += 1
    return {name: size(bound) for name, bound in bounds.items()}


def replayed(rule: dl.ScheduleRule, func: tirx.PrimFunc, target: Target, sizes: dict[str, int]) -> s_tir.Schedule | None:
    """``func`` (of dynamic extents) scheduled as ``rule`` schedules it with each dynamic dim at its
    size in ``sizes``: the static kernel's trace applied to the dynamic one, whose loops have the
    same nest. None if the rule takes no such kernel, a primitive refuses, or a split does not
    divide a dynamic extent (``_check_split``): a tile whose lanes each test a bound runs at scalar
    speed (a vector loop over 100,003 floats 12x slower than over 100,000), and BERT's softmax so
    replayed (the ``Rows`` rule's trace at 384 keys) gave wrong rows at 7 keys. In a kernel that
    attaches no block to its loops, a parallel loop fuses only as many leading loops as
    ``_parallel_prefix`` keeps."""
    try:
        static = rule.apply(at_sizes(func, sizes), target, False)
        if static is None:
            return None
        sch = UncheckedSchedule(func)
        inexact: list[str] = []
        positions = {inst: i for i, inst in enumerate(static.trace.insts)}
        prefixes: dict[int, int] = {}  # a Fuse's position in the trace: how many loops it keeps fused

        def provider(inst, inputs, _attrs, decision):
            _check_split(sch, inst, inputs, inexact)
            if (kept := _parallel_prefix(sch, inst, inputs)) is not None:
                prefixes[positions[inst]] = kept
            return decision

        static.trace.apply_to_schedule(sch, remove_postproc=False, decision_provider=provider)
        if prefixes and not inexact and not any(inst.kind.name in ATTACHING for inst in static.trace.insts):
            sch = UncheckedSchedule(func)
            _fused_prefixes(static.trace, prefixes).apply_to_schedule(sch, remove_postproc=False)
        if inexact or _dynamic_vectors(sch.mod["main"]):  # a split that does not divide a dynamic extent, or a
            log.debug("%s schedule does not replay on dynamic extents: %s", type(rule).__name__,  # dynamic vector
                      "; ".join(inexact) or "a vector of dynamic length")
            return None
        return sch
    except (s_tir.ScheduleError, ValueError, TypeError, tvm.error.InternalError) as err:
        log.debug("%s schedule does not replay on dynamic extents: %s", type(rule).__name__, str(err).splitlines()[0])
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
        labelled = [_Labelled(label, rule, sizes) for label, rule in rules(self.target)]
        mod = dl.ApplyDefaultSchedule(*labelled)(mod.clone())
        kinds = [schedule_kind(f) for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
        self.counts = dict(sorted(collections.Counter(kinds).items()))
        return mod
