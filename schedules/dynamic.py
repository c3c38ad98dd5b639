"""Static schedules applied to kernels of dynamic extents.

A kernel whose extents are expressions of the model's dynamic dims is scheduled by scheduling its
static kernel at some sizes (``passes.ir.at_sizes``) and applying that trace to the dynamic
kernel, whose loops have the same nest (``on_dynamic``). A default rule's trace at representative
sizes applies only where every split divides its dynamic extent (``exact``); a tuning record,
tuned at sizes the user names, applies ``relaxed``: each tile of a dynamic loop keeps its inner
factors and its outermost factor becomes the quotient rounded up, the last tile predicated
(``schedules/dynamic_tuning.py`` checks such a kernel at sizes from 1 to the bounds before any
compile uses it).
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym.analyzer import Analyzer

from relaxc.support.errors import message
from relaxc.support.tvm_internals import UncheckedSchedule

ROW_MULTIPLE = 8  # dynamic query rows are padded to register tiles of 8 (passes/attention.py)
PARALLEL_ITERATIONS = 4  # a dynamic kernel's parallel loop has at least these at every size (2 threads)
ESTIMATES = (tirx.Min, tirx.Max, tirx.Select, tirx.FloorDiv, tirx.FloorMod)  # what TVM's range estimates are made of
ATTACHING = {"ComputeAt", "ReverseComputeAt"}  # a block attached under a parallel loop computes its whole range
# How TVM says a trace does not replay on dynamic extents: a primitive refuses them (a ScheduleError:
# a loop of dynamic extent it cannot take, an index map not bijective there; the zoo's dynamic models
# give these), or a check of its trace replay fails on a trace ``relaxed`` rewrote (an InternalError,
# seen where tests/schedules/test_dynamic_tuning.py relaxes a record). Any other error is a bug.
REFUSALS = (s_tir.ScheduleError, tvm.error.InternalError)


class DoesNotReplay(Exception):
    """A static trace that does not apply to a kernel of dynamic extents, and why."""


def on_dynamic(trace: s_tir.schedule.Trace, func: tirx.PrimFunc, exact: bool = True) -> s_tir.Schedule:
    """``func`` (of dynamic extents) scheduled by ``trace``, the trace of its static kernel at some
    sizes. ``exact``: refused if a split does not divide a dynamic extent (``_check_split``): a
    tile whose lanes each test a bound runs at scalar speed (a vector loop over 100,003 floats 12x
    slower than over 100,000), and BERT's softmax so replayed (the ``Rows`` rule's trace at 384
    keys) gave wrong rows at 7 keys; else ``relaxed`` first. Refused too if it vectorises a loop of
    dynamic extent. In a kernel that attaches no block to its loops, a parallel loop fuses only as
    many leading loops as ``_parallel_prefix`` keeps; in one whose attached blocks come out over
    estimated ranges (``_estimated_loops``), only those whose index divides by constants
    (``_exact_prefixes``). Raises ``DoesNotReplay``."""
    try:
        if not exact:
            trace = relaxed(trace, func)
        sch = UncheckedSchedule(func)
        inexact: list[str] = []
        positions = {inst: i for i, inst in enumerate(trace.insts)}
        prefixes: dict[int, int] = {}  # a Fuse's position in the trace: how many loops it keeps fused

        def provider(inst, inputs, _attrs, decision):
            if exact:
                _check_split(sch, inst, inputs, inexact)
            if (kept := _parallel_prefix(sch, inst, inputs)) is not None:
                prefixes[positions[inst]] = kept
            return decision

        trace.apply_to_schedule(sch, remove_postproc=False, decision_provider=provider)
        if inexact:
            raise DoesNotReplay("; ".join(inexact))
        attaching = any(inst.kind.name in ATTACHING for inst in trace.insts)
        if prefixes and not attaching:
            sch = UncheckedSchedule(func)
            _fused_prefixes(trace, prefixes).apply_to_schedule(sch, remove_postproc=False)
        elif attaching and _estimated_loops(sch.mod["main"]):
            sch = UncheckedSchedule(func)  # the parallel loops fused only as far as the regions stay exact
            _fused_prefixes(trace, _exact_prefixes(func, trace)).apply_to_schedule(sch, remove_postproc=False)
            if estimated := _estimated_loops(sch.mod["main"]):
                raise DoesNotReplay(f"a block attached over an estimated range: {estimated[0]}")
        if _dynamic_vectors(sch.mod["main"]):
            raise DoesNotReplay("a vector of dynamic length")
        return sch
    except REFUSALS as err:
        raise DoesNotReplay(message(err, last=True)) from None


def relaxed(trace: s_tir.schedule.Trace, func: tirx.PrimFunc) -> s_tir.schedule.Trace:
    """``trace`` with each split of a loop that is dynamic in ``func`` made whole tiles and a
    remainder: its factors literal (a tile sampled on such a loop is fixed to the trace's
    decision, since TVM samples no tile of a dynamic extent), the outermost inferred. Which loops
    are dynamic shows only while the trace applies, so it applies again after each tile fixed."""
    fixed: dict = {}  # the outputs of a dropped SamplePerfectTile -> their decided factors
    dropped, opened = set(), set()  # SamplePerfectTile instructions removed; splits whose outer factor is inferred
    for _ in range(len(trace.insts) + 1):
        current, origin = _rewritten(trace, fixed, dropped, opened)
        sch = UncheckedSchedule(func)
        found: list = []

        def provider(inst, inputs, _attrs, decision):
            if inst.kind.name in ("SamplePerfectTile", "Split") and not isinstance(sch.get(inputs[0]).extent,
                                                                                   tirx.IntImm):
                found.append(origin[inst])
            return decision

        try:
            current.apply_to_schedule(sch, remove_postproc=False, decision_provider=provider)
        except REFUSALS:
            if not found or found[-1] in dropped or found[-1] in opened:  # not what failed
                raise
        new = [inst for inst in found if inst not in dropped and inst not in opened]
        if not new:
            return current
        for inst in new:
            if inst.kind.name == "SamplePerfectTile":
                dropped.add(inst)
                fixed.update((rv, tirx.IntImm("int64", int(v))) for rv, v in zip(inst.outputs, trace.decisions[inst]))
            else:
                opened.add(inst)
    raise DoesNotReplay("the trace's tiles of dynamic loops do not settle")


def _rewritten(trace: s_tir.schedule.Trace, fixed: dict, dropped: set, opened: set) -> tuple:
    """``trace`` without the instructions ``dropped``, their outputs replaced by ``fixed``, and the
    splits ``opened`` with their outermost factor inferred; and each new instruction's original."""
    insts, origin, decisions = [], {}, {}
    for inst in trace.insts:
        if inst in dropped:
            continue
        inputs = [fixed.get(x, x) if isinstance(x, tirx.Var) else x for x in inst.inputs]
        if inst in opened:
            inputs[1] = None
        new = s_tir.schedule.Instruction(inst.kind, inputs, inst.attrs, inst.outputs)
        insts.append(new)
        origin[new] = inst
        if (decision := trace.decisions.get(inst)) is not None:
            decisions[new] = decision
    return s_tir.schedule.Trace(insts, decisions), origin


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
    """``trace`` with the Fuse at each position of ``prefixes`` fusing only that many loops; a block
    the trace attached to such a fused loop attaches to the innermost loop it fused, now nested
    inside (the same tile, under as many more loops as the Fuse left out)."""
    insts, inside, deeper = [], {}, {}  # fused loop -> (its innermost loop, loops left out); block -> loops more
    for i, inst in enumerate(trace.insts):
        inputs, outputs = list(inst.inputs), list(inst.outputs)
        if i in prefixes and prefixes[i] < len(inputs):
            inside[outputs[0]] = (inputs[-1], len(inputs) - prefixes[i])
            inputs = inputs[:prefixes[i]]
        elif inst.kind.name in ATTACHING and inputs[1] in inside:
            inputs[1], deeper[inputs[0]] = inside[inputs[1]]
        elif inst.kind.name == "GetLoops" and inputs[0] in deeper:
            outputs[1:1] = [s_tir.schedule.LoopRV() for _ in range(deeper[inputs[0]])]
        insts.append(s_tir.schedule.Instruction(inst.kind, inputs, inst.attrs, outputs))
    return s_tir.schedule.Trace(insts, {insts[i]: d for i, inst in enumerate(trace.insts)
                                        if (d := trace.decisions.get(inst)) is not None})


def _estimated_loops(func: tirx.PrimFunc) -> list[tirx.PrimExpr]:
    """The loop extents of ``func`` that are TVM's estimates, not exact ranges: a min, a max, a
    select, or a division by a dynamic divisor. A block attached under a fused loop of dynamic extents
    (``ReverseComputeAt``) loops over the range TVM derives from the fused index; where its
    analyzer cannot follow the index (a fused head tile over ``past // 32 * 2 + 2`` keys tiles,
    which it no longer sees as ``2 * (past // 32 + 1)``), the range is a superset of the tile, and the
    block computes outputs of other parallel iterations from accumulators they have not written: a
    decoder's one-token scores at 12 heads came out garbage, different from run to run."""
    return [loop.extent for loop in _loops(func) if _nodes(loop.extent, ESTIMATES, lambda node: not (
        isinstance(node, (tirx.FloorDiv, tirx.FloorMod)) and isinstance(node.b, tirx.IntImm)))]


def _exact_prefixes(func: tirx.PrimFunc, trace: s_tir.schedule.Trace) -> dict[int, int]:
    """For each Fuse of ``trace`` (by position): how many leading loops it keeps fused so that each
    one's index divides the fused loop by constant extents alone: the loops up to the first dynamic
    one after the first."""
    sch = UncheckedSchedule(func)
    positions = {inst: i for i, inst in enumerate(trace.insts)}
    prefixes: dict[int, int] = {}

    def provider(inst, inputs, _attrs, decision):
        if inst.kind.name == "Fuse":
            extents = [sch.get(rv).extent for rv in inputs]
            prefixes[positions[inst]] = next((i for i, e in enumerate(extents) if i and not isinstance(e, tirx.IntImm)),
                                             len(extents))
        return decision

    trace.apply_to_schedule(sch, remove_postproc=False, decision_provider=provider)
    return prefixes


def _loops(func: tirx.PrimFunc) -> list[tirx.For]:
    return _nodes(func.body, tirx.For)


def _nodes(root, kinds, wanted=lambda _node: True) -> list:
    """The nodes of ``kinds`` under ``root`` that are ``wanted``."""
    found: list = []
    tvm_ffi.structural_map(root, (kinds, lambda node: found.append(node) or node if wanted(node) else node))
    return found


def _dynamic_vectors(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` vectorises a loop of dynamic extent (a loop whose extent was one vector at
    the representative size: LLVM code has no vector of dynamic length)."""
    return any(loop.kind == tirx.ForKind.VECTORIZED and not isinstance(loop.extent, tirx.IntImm)
               for loop in _loops(func))


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
