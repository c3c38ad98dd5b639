"""Storage planning: every intermediate tensor of ``main`` (and of a decoder's ``decode``) at an offset
in one arena per program.

Why here (docs/design.md): the planner runs after layout selection and fusion, on the final shapes, so
it plans the real padded, blocked sizes. Why an arena: TVM's ``StaticPlanBlockMemory`` reuses
whole storage blocks, so a small tensor can hold a large block hostage; placing tensors at byte
offsets of one arena lets any tensors whose lifetimes do not overlap share bytes (Pisarchyk and
Lee 2020, "Efficient Memory Management for Deep Neural Net Inference": greedy by size).

How: after ``CallTIRRewrite`` every intermediate is an ``R.builtin.alloc_tensor`` followed by the
kernels that write and read it. A tensor lives from its allocation to the last binding that uses
it or any alias of it (plain rebinding, reshape, tuples); tensors that reach the return value are
outputs and stay outside the arena, as do inputs and constants, which are never allocated here.
The arena is one ``R.memory.alloc_storage`` and each tensor an ``R.memory.alloc_tensor`` at its
offset, so the built artifact really allocates the planned arena. Tensors made by kernels the
caller marks unshared (a subgraph that plans its own memory) get bytes of their own.
"""

from __future__ import annotations

import fnmatch
import itertools
import random
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.sym.analyzer import Analyzer, ConstIntBound

from relaxc.passes.ir import is_op

ALIGNMENT = 64  # bytes: every offset and size is a multiple, so vector loads stay aligned
EXACT_LIMIT = 7  # up to this many tensors, every placement order is tried (optimal)
SEARCH_STEPS = 500  # local search steps over placement orders, when greedy stays above the bound
GARBAGE = 0x7F7F7F7F  # arena fill in validation mode: about 3.4e38 as float32, survives max()
PLANNERS = ("arena", "tvm")
PROGRAM_KEYS = ("arena_bytes", "lower_bound_bytes", "tvm_static_plan_bytes", "dynamic_allocations")  # of a program but main


@dataclass(frozen=True)
class Tensor:
    """A planned tensor: aligned size in bytes, lifetime as binding indices (inclusive)."""

    name: str
    size: int
    first: int
    last: int

    def overlaps(self, other: "Tensor") -> bool:
        return self.first <= other.last and other.first <= self.last


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def lower_bound(tensors: Sequence[Tensor]) -> int:
    """The largest sum of sizes of tensors live at the same binding: no placement does better."""
    if not tensors:
        return 0
    end = max(t.last for t in tensors) + 2
    live = np.zeros(end, dtype=np.int64)
    for t in tensors:
        live[t.first] += t.size
        live[t.last + 1] -= t.size
    return int(np.cumsum(live).max())


def _place(order: Sequence[Tensor], best_fit: bool, overlapping: dict[str, list[Tensor]]) -> tuple[dict[str, int], int]:
    """Offsets when tensors are placed in ``order``, each in a gap among those it overlaps in time
    (``overlapping``, from ``overlaps_in_time``): the smallest gap it fits (best fit) or the
    lowest (first fit); returns (offsets, arena size)."""
    offsets: dict[str, int] = {}
    top = 0
    for tensor in order:
        busy = sorted((offsets[t.name], offsets[t.name] + t.size)
                      for t in overlapping[tensor.name] if t.name in offsets)
        chosen, chosen_gap, cursor = None, None, 0
        for start, end in busy:
            gap = start - cursor
            if gap >= tensor.size and (chosen is None or (best_fit and gap < chosen_gap)):
                chosen, chosen_gap = cursor, gap
                if not best_fit:
                    break
            cursor = max(cursor, end)
        offset = cursor if chosen is None else chosen
        offsets[tensor.name] = offset
        top = max(top, offset + tensor.size)
    return offsets, top


def overlaps_in_time(tensors: Sequence[Tensor]) -> dict[str, list[Tensor]]:
    """Per tensor, the others live at some binding where it is: computed once per plan, as every
    placement order asks the same question (a placement scanning all placed tensors made the
    search over orders quadratic: 1.5 s of DenseNet-121's compile with Winograd's extra tensors)."""
    return {t.name: [o for o in tensors if o is not t and t.overlaps(o)] for t in tensors}


def plan(tensors: Sequence[Tensor]) -> tuple[dict[str, int], int]:
    """Offsets for ``tensors`` such that tensors live at the same time never share a byte.

    Up to ``EXACT_LIMIT`` tensors every order is tried with first fit, which is optimal (any
    optimal placement, replayed in the order of its offsets, places each tensor at or below its
    offset). Beyond that: the best of greedy by size (Pisarchyk and Lee's best fit) and three other
    orders, then a local search over the order (swap a few tensors, keep the result if it is no
    worse; seeded, so the same graph always gets the same plan) until the arena reaches the lower
    bound or ``SEARCH_STEPS`` run out. On DenseNet-121 the greedy orders stop 5.6% above the bound
    and the search reaches it.
    """
    if not tensors:
        return {}, 0
    overlapping = overlaps_in_time(tensors)
    if len(tensors) <= EXACT_LIMIT:
        return min((_place(order, False, overlapping) for order in itertools.permutations(tensors)),
                   key=lambda result: result[1])
    orders = [
        sorted(tensors, key=lambda t: (-t.size, t.first)),
        sorted(tensors, key=lambda t: (-(t.last - t.first), -t.size)),
        sorted(tensors, key=lambda t: (-t.size * (t.last - t.first + 1), t.first)),
        sorted(tensors, key=lambda t: (t.first, -t.size)),
    ]
    (offsets, top), order = min(((_place(o, True, overlapping), o) for o in orders), key=lambda r: r[0][1])
    bound = lower_bound(tensors)
    rng = random.Random(0)
    for _ in range(SEARCH_STEPS):
        if top <= bound:
            break
        candidate = list(order)
        for _ in range(rng.randint(1, 3)):
            i, j = rng.randrange(len(candidate)), rng.randrange(len(candidate))
            candidate[i], candidate[j] = candidate[j], candidate[i]
        for best_fit in (True, False):
            new_offsets, new_top = _place(candidate, best_fit, overlapping)
            if new_top <= top:
                order, offsets, top = candidate, new_offsets, new_top
    return offsets, top


def verify_placement(tensors: Sequence[Tensor], offsets: dict[str, int], arena_bytes: int) -> list[str]:
    """Every problem with a placement, checked pair by pair without the planner's code."""
    problems = []
    for t in tensors:
        offset = offsets[t.name]
        if offset % ALIGNMENT or offset < 0 or offset + t.size > arena_bytes:
            problems.append(f"{t.name} at [{offset}, {offset + t.size}) is misaligned or outside the arena")
    for a, b in itertools.combinations(tensors, 2):
        oa, ob = offsets[a.name], offsets[b.name]
        if a.overlaps(b) and oa < ob + b.size and ob < oa + a.size:
            problems.append(f"{a.name} [{oa}, {oa + a.size}) and {b.name} [{ob}, {ob + b.size}) "
                            f"are live together (bindings {max(a.first, b.first)}-{min(a.last, b.last)}) "
                            "and share bytes")
    return problems


# --- lifetimes of the lowered main function ------------------------------------------------------

def upper_bounds(func: relax.Function) -> dict[str, int]:
    """The largest size of each dynamic dim of ``func`` (its ``tir_var_upper_bound``)."""
    attrs = func.attrs or {}
    return {str(name): int(bound) for name, bound in (attrs["tir_var_upper_bound"].items()
                                                       if "tir_var_upper_bound" in attrs else [])}


def main_bounds(mod: tvm.IRModule) -> dict[str, int]:
    """``upper_bounds`` of ``mod``'s ``main``; none for a module without one."""
    main = next((f for gv, f in mod.functions_items() if gv.name_hint == "main"), None)
    return upper_bounds(main) if main is not None else {}


def main_empty_dims(mod: tvm.IRModule) -> set[str]:
    """The dynamic dims of ``mod``'s ``main`` that may be 0 (a ``tir_var_lower_bound`` of 0)."""
    main = next((f for gv, f in mod.functions_items() if gv.name_hint == "main"), None)
    lows = (main.attrs or {}).get("tir_var_lower_bound", {}) if main is not None else {}
    return {str(name) for name, low in lows.items() if int(low) == 0}


def bytes_at_bounds(shape: relax.Expr, dtype: str, bounds: dict[str, int]) -> int | None:
    """Bytes of a tensor of ``shape``, its dynamic dims at the most their bounds allow (None for a
    shape that is no expression of them: one computed at run time)."""
    if not isinstance(shape, relax.ShapeExpr):
        return None
    analyzer = Analyzer()
    elements = tirx.const(1, "int64")
    for dim in shape.values:
        elements = elements * dim
    for var in tirx.analysis.undefined_vars(elements):
        if var.name not in bounds:
            return None
        analyzer.bind(var, tvm.ir.Range(1, bounds[var.name] + 1))
    largest = analyzer.const_int_bound(elements).max_value
    if largest >= ConstIntBound.POS_INF:
        return None
    return int(largest) * tvm.runtime.DataType(dtype).bits // 8


def _static_bytes(call: relax.Call, bounds: dict[str, int]) -> int | None:
    return bytes_at_bounds(call.args[0], str(call.args[1].value), bounds)


def _vars_in(expr: relax.Expr) -> list[relax.Var]:
    found: list[relax.Var] = []
    relax.analysis.post_order_visit(expr, lambda e: found.append(e) if isinstance(e, relax.Var) else None)
    return found


@dataclass
class Lifetimes:
    """What ``analyse`` found in a lowered ``main``."""

    tensors: list[Tensor] = field(default_factory=list)
    calls: dict[str, relax.Call] = field(default_factory=dict)  # tensor name -> its alloc_tensor
    producers: dict[str, str] = field(default_factory=dict)  # tensor name -> kernel writing it first
    outputs: list[str] = field(default_factory=list)  # allocations that reach the return value
    dynamic: int = 0  # allocations without a static size (left to TVM)
    alignment: dict[str, int] = field(default_factory=dict)  # tensor name -> bytes added by alignment
    kernel_args: list[tuple[relax.GlobalVar, set[str]]] = field(default_factory=list)  # per call


def analyse(func: relax.Function, unshared: Sequence[str] = ()) -> Lifetimes:
    """Lifetimes of the intermediate tensors of ``func`` (after CallTIRRewrite)."""
    bindings = [b for block in func.body.blocks for b in block.bindings]
    bounds = upper_bounds(func)
    owners: dict[relax.Var, set[str]] = {}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    result = Lifetimes()
    for index, binding in enumerate(bindings):
        value, var = binding.value, binding.var
        if is_op(value, "relax.builtin.alloc_tensor"):
            size = _static_bytes(value, bounds)
            if size is None:
                result.dynamic += 1
                continue
            owners[var] = {var.name}
            first[var.name] = last[var.name] = index
            result.calls[var.name] = value
            result.alignment[var.name] = aligned(size) - size
            result.tensors.append(Tensor(var.name, aligned(size), index, index))
            continue
        used = set().union(*(owners.get(v, set()) for v in _vars_in(value)))
        for name in used:
            last[name] = index
        if isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar):
            result.kernel_args.append((value.op, used))
            for arg in value.args:  # destination-passing kernel: its last tensor argument is written
                if isinstance(arg, relax.Var) and arg in owners:
                    for name in owners[arg]:
                        result.producers.setdefault(name, value.op.name_hint)
        if used:  # anything computed from an arena tensor may be a view of it (reshape, tuple)
            owners[var] = used
    returned = set().union(*(owners.get(v, set()) for v in _vars_in(func.body.body)))
    result.outputs = sorted(returned)
    end = len(bindings)
    tensors = []
    for t in result.tensors:
        if t.name in returned:
            continue
        kernel = result.producers.get(t.name, "")
        exclusive = any(fnmatch.fnmatch(kernel, pattern) for pattern in unshared)
        tensors.append(Tensor(t.name, t.size, 0 if exclusive else first[t.name], end if exclusive else last[t.name]))
    result.tensors = tensors
    return result


def _storage_bytes(func: relax.Function) -> int:
    """Bytes of every static ``alloc_storage`` in ``func`` (what a planner made it allocate)."""
    total = 0
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if is_op(value, "relax.memory.alloc_storage") and isinstance(value.args[0], relax.ShapeExpr):
                total += int(value.args[0].values[0])
    return total


# --- the rewrite -----------------------------------------------------------------------------------

def accepting_offsets(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with parameter buffers that accept a tensor at a byte offset of its storage.

    TVM's kernels assert ``byte_offset == 0`` on every argument unless the buffer has a symbolic
    element offset, and on CPU the VM gives a tensor at a storage offset exactly that byte offset
    (TVM's own planner only ever uses offset 0). Each parameter becomes a buffer with a symbolic
    element offset (a multiple of 64 bytes, so kernels keep their alignment), and the original
    buffer is declared over the address of its first element (its own element offset, where it
    has a symbolic one, bound to 0), so the body is unchanged.
    """
    params, declarations = [], []
    for param in func.params:
        if not tirx.is_buffer_var(param):
            params.append(param)
            continue
        itemsize = max(1, tvm.runtime.DataType(str(param.dtype)).bits // 8)
        outer = tirx.decl_buffer(param.shape, param.dtype, f"{param.name}_arg",
                                 elem_offset=tirx.Var(f"{param.name}_elem_offset", "int64"),
                                 offset_factor=max(1, ALIGNMENT // itemsize))
        params.append(outer)
        if isinstance(param.elem_offset, tirx.Var):  # TOPI's ir_builder kernels (scatter) declare one
            declarations.append(tirx.LetStmt(param.elem_offset, tirx.const(0, str(param.elem_offset.ty))))
        declarations.append(tirx.DeclBuffer(param, data=tirx.address_of(
            tirx.BufferLoad(outer, [0] * len(param.shape)))))
    return tirx.PrimFunc(params, tirx.SeqStmt(declarations + [func.body]), func.ret_type, func.attrs)


def _fill_kernel(words: int) -> tirx.PrimFunc:
    """A PrimFunc writing the garbage pattern over an arena viewed as ``words`` uint32."""
    from tvm.script import tirx as T

    @T.prim_func(private=True)
    def fill(arena: T.Buffer((words,), "uint32")):
        for i in T.parallel(words):
            arena[i] = T.uint32(GARBAGE)

    return fill


@relax.expr_functor.mutator
class _ArenaRewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, offsets: dict[str, int], calls: dict[str, relax.Call],
                 arena_bytes: int, fill: relax.GlobalVar | None) -> None:
        super().__init__(mod)
        self.offsets = offsets
        self.calls = calls
        self.arena_bytes = arena_bytes
        self.fill = fill
        self.arena: relax.Var | None = None

    def _arena(self) -> relax.Var:
        if self.arena is None:
            self.arena = self.builder_.emit(relax.op.memory.alloc_storage(
                relax.ShapeExpr([self.arena_bytes]), 0, "global", "uint8"), name_hint="arena")
            if self.fill is not None:
                words = self.builder_.emit(relax.op.memory.alloc_tensor(
                    self.arena, 0, relax.ShapeExpr([self.arena_bytes // 4]), "uint32"), name_hint="arena_words")
                self.builder_.emit(relax.Call(self.fill, [words]), name_hint="_")
        return self.arena

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        name = binding.var.name
        if name not in self.offsets or not binding.value.same_as(self.calls[name]):
            return super().visit_var_binding_(binding)
        call = self.calls[name]
        new = relax.op.memory.alloc_tensor(self._arena(), self.offsets[name], call.args[0], call.args[1])
        self.set_var_remap(binding.var, self.builder_.emit(new, name_hint=name))


@tvm.transform.module_pass(opt_level=0, name="relaxc.ArenaPlan")
class ArenaPlan:
    """Plan the intermediates of ``main`` and of every other program of the module (a decoder's
    ``decode``), each into an arena of its own (planner "arena"), or leave them to TVM's
    StaticPlanBlockMemory (planner "tvm"); either way ``summary()`` reports both plans, main's in
    full and the others' sizes under ``programs``.

    ``unshared``: glob patterns of kernel names whose outputs get bytes of their own.
    ``validate``: check the placement pair by pair, and fill the arena with garbage before each
    run, so a read of memory nobody wrote, or that another tensor overwrote, shows in the outputs.
    ``padding_bytes``: channel padding in the planned tensors, reported beside the plan (only the
    layout pass, before fusion, can count it).
    """

    report_key = "memory"

    def __init__(self, planner: str = "arena", unshared: Sequence[str] = (), validate: bool = False,
                 padding_bytes: int = 0) -> None:
        if planner not in PLANNERS:
            raise ValueError(f"memory planner must be one of {', '.join(PLANNERS)}, not {planner!r}")
        self.planner = planner
        self.unshared = tuple(unshared)
        self.validate = validate
        self.padding_bytes = padding_bytes
        self.report: dict = {}

    def summary(self) -> dict:
        return self.report

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        programs = sorted((gvar for gvar, func in mod.functions_items() if isinstance(func, relax.Function)),
                          key=lambda g: (g.name_hint != "main", g.name_hint))  # main, then a decoder's decode
        tvm_plan = relax.transform.StaticPlanBlockMemory()(mod)  # TVM's plan of every program, to compare with
        reports, shifted = {}, set()
        for gvar in programs:
            mod, reports[gvar.name_hint], kernels = self._plan(mod, gvar, _storage_bytes(tvm_plan[gvar]))
            shifted |= kernels
        for kernel in shifted:  # once, whichever programs call it at an offset
            mod[kernel] = accepting_offsets(mod[kernel])
        self.report = reports.pop("main")
        if reports:
            self.report["programs"] = {name: {key: report[key] for key in PROGRAM_KEYS}
                                       for name, report in reports.items()}
        return mod

    def _plan(self, mod: tvm.IRModule, gvar: relax.GlobalVar,
              tvm_bytes: int) -> tuple[tvm.IRModule, dict, set[relax.GlobalVar]]:
        """``mod`` with ``gvar``'s intermediates planned, the plan's report (beside TVM's ``tvm_bytes``),
        and the kernels it calls at a byte offset of the arena."""
        found = analyse(mod[gvar], self.unshared)
        offsets, arena_bytes = plan(found.tensors)
        problems = verify_placement(found.tensors, offsets, arena_bytes)
        if problems:  # a planner bug: never build a model that would compute garbage
            raise RuntimeError(f"memory plan of {gvar.name_hint} is invalid: " + "; ".join(problems[:5]))
        report = {
            "planner": self.planner,
            "arena_bytes": arena_bytes if self.planner == "arena" else tvm_bytes,
            "lower_bound_bytes": lower_bound(found.tensors),
            "tvm_static_plan_bytes": tvm_bytes,
            "no_reuse_bytes": sum(t.size for t in found.tensors),
            "alignment_bytes": sum(found.alignment[t.name] for t in found.tensors),
            "padding_bytes": self.padding_bytes,
            "unshared": list(self.unshared),
            "validated": self.validate,
            "outputs": found.outputs,
            "dynamic_allocations": found.dynamic,
            "tensors": [{"name": t.name, "bytes": t.size, "offset": offsets[t.name], "first": t.first,
                         "last": t.last, "kernel": found.producers.get(t.name, "")}
                        for t in sorted(found.tensors, key=lambda t: t.first)],
        }
        if self.planner == "tvm" or not found.tensors:
            return mod, report, set()
        fill = None
        if self.validate:
            builder = relax.BlockBuilder(mod)
            fill = builder.add_func(_fill_kernel(arena_bytes // 4), "relaxc_fill_arena")
            mod = builder.get()
        rewriter = _ArenaRewriter(mod, offsets, found.calls, arena_bytes, fill)
        new = mod.clone()
        new[gvar] = rewriter.visit_expr(mod[gvar])
        shifted = {kernel for kernel, names in found.kernel_args if any(offsets.get(n, 0) for n in names)}
        report["kernels_accepting_offsets"] = len(shifted)
        return new, report, shifted
