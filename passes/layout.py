"""Layout selection: NCHW convolutions become blocked NCHW{b}c, channels zero-padded to the block.

Why a pass of its own (docs/design.md): memory planning must see the real, padded tensor sizes, so
layouts are chosen before fusion and planning, and this pass only rewrites the graph; it never
allocates. Why blocked: with the channel block innermost, a convolution's output channels are one
vector register and every weight load is contiguous.

How: one walk over the bindings in order. Every value remembers the layout it was produced in and
the versions already converted for other consumers, so a converter is inserted only where a
producer and a consumer disagree, and at most once per value and layout. Layout-agnostic ops
(pointwise, per-channel broadcasts, pooling, concat of whole blocks) take the layout of their
inputs. Converters already in the graph are recognised and become plain aliases of the value they
convert, so a to-standard followed by a from-standard of the same value cancels.

Padded channels hold finite values that no result depends on: convolutions read them through
zero weights and write zeros, per-channel ops keep them finite (constants are padded with 0, or 1
for a divisor), and every way back to the standard layout slices them off. Ops whose result could
depend on them (softmax, reductions or normalisation over C, reshape, transpose, flatten into a
matmul, anything not listed here) get standard, unpadded data.
"""

from __future__ import annotations

import collections
import functools
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from relaxc.passes.memory import upper_bounds
from relaxc.passes.ir import batched_shape, rewrite_emitting
from relaxc.passes.layout_algebra import REGISTRY, STANDARD, Layout, blocked
from relaxc.passes.layout_rules import RULES, channel_slice, rebuilt


@dataclass
class LayoutStats:
    """What the pass did, for ``Artifact.report()["layout"]``."""

    block: int
    blocked_ops: int = 0
    standard_ops: int = 0
    converters: int = 0
    cancelled_pairs: int = 0
    padded_tensors: list[dict] = field(default_factory=list)
    padding_bytes: int = 0
    weight_padding_bytes: int = 0
    standard_op_kinds: collections.Counter = field(default_factory=collections.Counter)

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out["standard_op_kinds"] = dict(sorted(self.standard_op_kinds.items()))
        return out


@dataclass
class Value:
    """One tensor of the original graph: its real channel count and its versions per layout."""

    channels: int
    versions: dict[str, relax.Expr]  # layout name -> expression; the first entry is the home

    @property
    def home(self) -> Layout:
        return REGISTRY[next(iter(self.versions))]


def flatten_tuples(exprs: list[relax.Expr]) -> list[relax.Expr]:
    """Arguments with tuples expanded (call_tir passes its tensors in a tuple)."""
    return [e for expr in exprs for e in (flatten_tuples(expr.fields) if isinstance(expr, relax.Tuple) else [expr])]


def _same_map(index_map: tvm.tirx.IndexMap, func: Callable) -> bool:
    return tvm_ffi.structural_equal(index_map, tvm.tirx.IndexMap.from_func(func), map_free_vars=True)


_ALIAS = object()  # a handler's answer: the var is another name of a value already tracked


@relax.expr_functor.mutator
class Rewriter(relax.PyExprMutator):
    """The walk over a function's bindings in order: every tracked tensor with its versions per
    layout, converters emitted where a consumer reads a layout its producer did not make, and each
    op rewritten by its rule (``passes/layout_rules.py``) or run on standard data."""

    def __init__(self, mod: tvm.IRModule, layout: Layout, stats: LayoutStats, plan: Mapping[relax.Var, Layout]) -> None:
        super().__init__(mod)
        self.layout = layout
        self.stats = stats
        self.plan = plan
        self.values: dict[relax.Var, Value] = {}
        self.origin: dict[relax.Var, Layout] = {}  # the layout each var had in the input graph
        self.bounds: dict[str, int] = {}  # the function's dynamic dims' bounds (a dynamic batch's)
        self.handlers: dict[str, Callable[[relax.Call, relax.Var], object]] = {
            op: functools.partial(rule, self) for op, rule in RULES.items()}
        self.handlers.update({"relax.layout_transform": self._layout_transform,
                              "relax.strided_slice": self._strided_slice})
        self.unsliced: dict[relax.Var, relax.Var] = {}  # to-standard result still padded -> its source
        self.concats: dict[relax.Var, tuple[Layout, list[relax.Expr], list[int]]] = {}  # layout, parts, channels

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        self.bounds = upper_bounds(func)
        return super().visit_function_(func)

    # --- values and converters -------------------------------------------------------------
    def tracked(self, expr: relax.Expr) -> Value | None:
        """The tracked tensor behind ``expr``; graph inputs are tracked on first use."""
        if not isinstance(expr, relax.Var):
            return None
        if expr not in self.values:
            shape = batched_shape(expr)
            if shape is None or len(shape) != 4 or expr.ty.dtype != "float32":
                return None
            self.values[expr] = Value(shape[1], {STANDARD.name: self.visit_expr(expr)})
            self.origin[expr] = STANDARD
        return self.values[expr]

    def get(self, expr: relax.Expr, layout: Layout | None = None) -> relax.Expr:
        """``expr`` in ``layout`` (default: the layout the input graph had it in)."""
        if isinstance(expr, relax.Tuple):  # e.g. the arguments of call_tir
            return relax.Tuple([self.get(field, layout) for field in expr.fields])
        value = self.tracked(expr)
        if value is None:
            return self.visit_expr(expr)
        layout = layout or self.origin[expr]
        if layout.name not in value.versions:
            self._convert(value, layout, expr.name)
            self.stats.converters += 1
        return value.versions[layout.name]

    def _convert(self, value: Value, layout: Layout, name: str) -> None:
        """Emit ``value`` in ``layout`` (through the standard layout, kept as a version of its own,
        if it is blocked in another)."""
        home = value.home
        if layout.standard:
            value.versions[layout.name] = self.builder_.emit(home.to_standard(value.versions[home.name], value.channels))
            return
        if STANDARD.name not in value.versions:
            self._convert(value, STANDARD, name)
        value.versions[layout.name] = self.builder_.emit(layout.from_standard(value.versions[STANDARD.name]))
        self.note_padding(name, value.channels, layout, value.versions[layout.name])

    def note_padding(self, name: str, channels: int, layout: Layout, expr: relax.Expr) -> None:
        """Count ``expr`` (fp32, NCHW or NCHW{b}c) in the report if ``layout`` pads its channels."""
        padded = layout.padded(channels)
        if padded == channels:
            return
        shape = batched_shape(expr)
        batch = shape[0] if isinstance(shape[0], int) else self.bounds.get(str(shape[0]), 1)  # a dynamic batch at its bound
        per_channel = batch * int(np.prod(shape[1:])) // (shape[1] * (shape[4] if len(shape) == 5 else 1))
        self.stats.padded_tensors.append({"name": name, "from": channels, "to": padded})
        self.stats.padding_bytes += (padded - channels) * per_channel * 4

    def _followed(self, args: list[relax.Expr]) -> Layout | None:
        """The layout of the first tracked argument that is blocked, None if none is."""
        return next((v.home for a in args if (v := self.tracked(a)) is not None and not v.home.standard), None)

    def target(self, var: relax.Var, args: list[relax.Expr]) -> Layout | None:
        """The blocked layout ``var``'s op runs in, None for the standard one: the plan's where it
        has one (``passes/layout_choice.py``), else the layout of its first blocked argument
        (layouts follow their producers)."""
        planned = self.plan.get(var)
        if planned is not None:
            return None if planned.standard else planned
        return self._followed(args)

    # --- bindings ------------------------------------------------------------------------------
    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value, var = binding.value, binding.var
        in_dataflow = self.builder_.current_block_is_dataflow()
        is_output = in_dataflow and not isinstance(var, relax.DataflowVar)
        result = None
        if in_dataflow and isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) \
                and value.op.name in self.handlers:
            result = self.handlers[value.op.name](value, var)
        if result is _ALIAS:
            alias = self.values[var]
            home = alias.versions[alias.home.name]
            self.set_var_remap(var, self.builder_.emit_output(self.get(var), name_hint=var.name)
                               if is_output else home)
            return
        new, layout, channels = result if result is not None else (self._fallback(value), STANDARD, None)
        if not layout.standard:
            self.stats.blocked_ops += 1
        if is_output and layout.standard:
            emitted = self.builder_.emit_output(new, name_hint=var.name)
        else:
            emitted = self.builder_.emit(new, name_hint=var.name)
        shape = batched_shape(emitted)
        if not layout.standard or (shape is not None and len(shape) == 4):
            self.values[var] = Value(channels if channels is not None else shape[1], {layout.name: emitted})
            self.origin[var] = STANDARD
        if is_output and not layout.standard:  # block outputs leave in the layout they came in
            emitted = self.builder_.emit_output(self.get(var), name_hint=var.name)
        self.set_var_remap(var, emitted)

    def _fallback(self, value: relax.Expr) -> relax.Expr:
        """Any other op: every argument in the layout the input graph gave it."""
        if isinstance(value, relax.Call):
            if any(self.tracked(a) is not None for a in flatten_tuples(value.args)):
                self.stats.standard_ops += 1
                self.stats.standard_op_kinds[getattr(value.op, "name", "call")] += 1
            return relax.Call(self.visit_expr(value.op), [self.get(a) for a in value.args],
                              value.attrs, value.ty_args)
        if isinstance(value, relax.Tuple):
            return relax.Tuple([self.get(f) for f in value.fields])
        return self.get(value)

    # --- converters already in the graph: handlers as the rules of passes/layout_rules.py, or _ALIAS
    # for a var registered as another name of an existing value ------------------------------------

    def _layout_transform(self, call: relax.Call, var: relax.Var):
        """A converter already in the graph: its result is an alias of the value it converts."""
        source = call.args[0]
        value, shape = self.tracked(source), batched_shape(call)
        if value is None or shape is None:
            return None
        source_layout = self.origin[source]
        if source_layout.standard and len(shape) == 5:
            target = blocked(shape[4])
            expected = target.from_standard_map()
        elif not source_layout.standard and len(shape) == 4:
            target = STANDARD
            expected = source_layout.to_standard_map()
        else:
            return None
        if not _same_map(call.attrs.index_map, expected):
            return None
        if target.standard and shape[1] != value.channels:
            self.unsliced[var] = source  # still padded: the strided_slice after it finishes it
            return rebuilt(call, [self.get(source)]), STANDARD, shape[1]
        return self._alias(var, value, target)

    def _strided_slice(self, call: relax.Call, var: relax.Var):
        shape = batched_shape(call)
        source = self.unsliced.get(call.args[0])
        if source is None:
            return channel_slice(self, call, var)
        if shape is None or shape[1] != self.values[source].channels:
            return None
        return self._alias(var, self.values[source], STANDARD)

    def _alias(self, var: relax.Var, value: Value, layout: Layout):
        if layout.name in value.versions:
            self.stats.cancelled_pairs += 1  # the value already exists in that layout
        else:
            self._convert(value, layout, var.name)  # the converter stays: it was in the input
        self.values[var] = value
        self.origin[var] = layout
        return _ALIAS


def homes(mod: tvm.IRModule, layout: Layout) -> dict[relax.Var, Layout]:
    """The layout each tracked tensor of ``mod`` is produced in when every op that can runs in
    ``layout``: what ``passes/layout_choice.py`` offers each op."""
    rewriter = Rewriter(mod.clone(), layout, LayoutStats(layout.block), {})
    rewrite_emitting(mod, rewriter)
    return {var: value.home for var, value in rewriter.values.items()}


@tvm.transform.module_pass(opt_level=0, name="relaxc.LayoutPass")
class LayoutPass:
    """Rewrite NCHW convolutions and the ops around them into NCHW{block}c (see module docstring).

    ``block == 0`` keeps every op in NCHW. ``planner`` (the graph-level choice of
    ``passes/layout_choice.py``) returns a plan for the module, and what to report of it: the
    layout of ops by their variable: a convolution runs in its planned layout instead of
    ``block``'s, any other op in its planned layout instead of its first blocked input's. ``summary()`` (``report()["layout"]``) says what
    the last run did; ``why`` says why this block was chosen, and ``names`` maps graph inputs to
    the names the user knows them by (the importer renames some to C identifiers).
    """

    report_key = "layout"

    def __init__(self, block: int, why: str = "given by the caller", names: dict[str, str] | None = None,
                 planner: Callable[[tvm.IRModule], tuple[Mapping[relax.Var, Layout], dict]] | None = None) -> None:
        if block == 1 or block < 0:
            raise ValueError(f"channel block must be 0 (off) or at least 2, not {block}")
        self.layout = blocked(block) if block else STANDARD
        self.why = why
        self.names = names or {}
        self.planner = planner
        self.choice: dict | None = None  # what the planner reported
        self.stats = LayoutStats(block)

    def summary(self) -> dict:
        summary = self.stats.as_dict()
        summary["padded_tensors"] = [{**t, "name": self.names.get(t["name"], t["name"])}
                                     for t in summary["padded_tensors"]]
        return {**summary, "why": self.why, **({"choice": self.choice} if self.choice is not None else {})}

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.stats = LayoutStats(self.layout.block)
        if self.layout.standard:
            return mod
        plan: Mapping[relax.Var, Layout] = {}
        if self.planner is not None:
            plan, self.choice = self.planner(mod)
        new = rewrite_emitting(mod, Rewriter(mod.clone(), self.layout, self.stats, plan))  # a copy: see passes/ir.py
        return relax.transform.DeadCodeElimination()(new)
