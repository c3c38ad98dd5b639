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
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from relaxc.passes.memory import upper_bounds
from relaxc.passes.ir import batched_shape, constant_array, constant_ints, rewrite_emitting, static_shape
from relaxc.passes.layout_algebra import (REGISTRY, STANDARD, Layout, block_constant, blocked, input_block, pack_conv_weight,
                                         pack_windowed_conv_weight)
from relaxc.passes.legalize import channel_tables, conv2d_nchwc, gather_channels_nchwc




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
class _Value:
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
_UNARY = {"relax.nn.relu", "relax.clip", "relax.sigmoid", "relax.tanh", "relax.erf", "relax.nn.silu",
          "relax.nn.leakyrelu", "relax.astype"}
# Binary pointwise ops and the value padded channels of a constant operand get.
_BINARY = {"relax.add": 0.0, "relax.subtract": 0.0, "relax.multiply": 0.0, "relax.maximum": 0.0,
           "relax.minimum": 0.0, "relax.divide": 1.0}
_QUANTIZE = {"relax.quantize", "relax.dequantize"}  # pointwise where the scale and zero point are one each
ELEMENTWISE = frozenset(_UNARY) | frozenset(_BINARY) | frozenset(_QUANTIZE)  # fused into their producer: cost nothing of their own
_POOLS = {"relax.nn.max_pool2d": relax.op.nn.max_pool2d, "relax.nn.avg_pool2d": relax.op.nn.avg_pool2d,
          "relax.nn.adaptive_avg_pool2d": relax.op.nn.adaptive_avg_pool2d}
_SPATIAL_REDUCTIONS = {"relax.mean": relax.op.mean, "relax.sum": relax.op.sum, "relax.max": relax.op.max,
                       "relax.min": relax.op.min}


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, layout: Layout, stats: LayoutStats, plan: Mapping[relax.Var, Layout]) -> None:
        super().__init__(mod)
        self.layout = layout
        self.stats = stats
        self.plan = plan
        self.values: dict[relax.Var, _Value] = {}
        self.origin: dict[relax.Var, Layout] = {}  # the layout each var had in the input graph
        self.bounds: dict[str, int] = {}  # the function's dynamic dims' bounds (a dynamic batch's)
        self.handlers = {"relax.nn.conv2d": self._conv2d, "relax.concat": self._concat,
                         "relax.layout_transform": self._layout_transform,
                         "relax.strided_slice": self._strided_slice, "relax.take": self._take,
                         "relax.nn.layer_norm": self._layer_norm, "relax.image.resize2d": self._resize2d}
        self.handlers.update({op: self._unary for op in _UNARY})
        self.handlers.update({op: self._quantize for op in _QUANTIZE})
        self.handlers.update({op: self._binary for op in _BINARY})
        self.handlers.update({op: self._pool for op in _POOLS})
        self.handlers.update({op: self._spatial_reduction for op in _SPATIAL_REDUCTIONS})
        self.unsliced: dict[relax.Var, relax.Var] = {}  # to-standard result still padded -> its source
        self.concats: dict[relax.Var, tuple[Layout, list[relax.Expr], list[int]]] = {}  # layout, parts, channels

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        self.bounds = upper_bounds(func)
        return super().visit_function_(func)

    # --- values and converters -------------------------------------------------------------
    def _value(self, expr: relax.Expr) -> _Value | None:
        """The tracked tensor behind ``expr``; graph inputs are tracked on first use."""
        if not isinstance(expr, relax.Var):
            return None
        if expr not in self.values:
            shape = batched_shape(expr)
            if shape is None or len(shape) != 4 or expr.ty.dtype != "float32":
                return None
            self.values[expr] = _Value(shape[1], {STANDARD.name: self.visit_expr(expr)})
            self.origin[expr] = STANDARD
        return self.values[expr]

    def _get(self, expr: relax.Expr, layout: Layout | None = None) -> relax.Expr:
        """``expr`` in ``layout`` (default: the layout the input graph had it in)."""
        if isinstance(expr, relax.Tuple):  # e.g. the arguments of call_tir
            return relax.Tuple([self._get(field, layout) for field in expr.fields])
        value = self._value(expr)
        if value is None:
            return self.visit_expr(expr)
        layout = layout or self.origin[expr]
        if layout.name not in value.versions:
            self._convert(value, layout, expr.name)
            self.stats.converters += 1
        return value.versions[layout.name]

    def _convert(self, value: _Value, layout: Layout, name: str) -> None:
        """Emit ``value`` in ``layout`` (through the standard layout, kept as a version of its own,
        if it is blocked in another)."""
        home = value.home
        if layout.standard:
            value.versions[layout.name] = self.builder_.emit(home.to_standard(value.versions[home.name], value.channels))
            return
        if STANDARD.name not in value.versions:
            self._convert(value, STANDARD, name)
        value.versions[layout.name] = self.builder_.emit(layout.from_standard(value.versions[STANDARD.name]))
        self._note_padding(name, value.channels, layout, value.versions[layout.name])

    def _note_padding(self, name: str, channels: int, layout: Layout, expr: relax.Expr) -> None:
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
        return next((v.home for a in args if (v := self._value(a)) is not None and not v.home.standard), None)

    def _target(self, var: relax.Var, args: list[relax.Expr]) -> Layout | None:
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
            self.set_var_remap(var, self.builder_.emit_output(self._get(var), name_hint=var.name)
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
            self.values[var] = _Value(channels if channels is not None else shape[1], {layout.name: emitted})
            self.origin[var] = STANDARD
        if is_output and not layout.standard:  # block outputs leave in the layout they came in
            emitted = self.builder_.emit_output(self._get(var), name_hint=var.name)
        self.set_var_remap(var, emitted)

    def _fallback(self, value: relax.Expr) -> relax.Expr:
        """Any other op: every argument in the layout the input graph gave it."""
        if isinstance(value, relax.Call):
            if any(self._value(a) is not None for a in flatten_tuples(value.args)):
                self.stats.standard_ops += 1
                self.stats.standard_op_kinds[getattr(value.op, "name", "call")] += 1
            return relax.Call(self.visit_expr(value.op), [self._get(a) for a in value.args],
                              value.attrs, value.ty_args)
        if isinstance(value, relax.Tuple):
            return relax.Tuple([self._get(f) for f in value.fields])
        return self._get(value)

    def _rebuilt(self, call: relax.Call, args: list[relax.Expr]) -> relax.Call:
        return relax.Call(call.op, args, call.attrs, call.ty_args)

    # --- handlers: return (new expr, its layout, real channels), _ALIAS for a var registered as
    # another name of an existing value, or None to fall back to the standard layout -------------
    def _conv2d(self, call: relax.Call, var: relax.Var):
        attrs = call.attrs
        if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCHW", "OIHW", "NCHW"):
            return None
        data, weight = call.args
        value, array = self._value(data), constant_array(weight)
        out = self.plan.get(var, self.layout)
        if value is None or array is None or out.standard:
            return None
        # blocked input: read in the conv's own layout (the cost the layout choice assumes)
        depth = 4 if str(data.ty.dtype) in ("uint8", "int8") else 1
        in_layout = out if not value.home.standard else blocked(input_block(value.channels, out.block, depth))
        packed = pack_conv_weight(array, int(attrs.groups), in_layout.block, out.block)
        if packed is None:
            return self._windowed_conv2d(call, value, array, in_layout, out)
        kernel, kernel_layout, groups = packed
        self.stats.weight_padding_bytes += (kernel.size - array.size) * array.itemsize
        new = relax.op.nn.conv2d(
            self._get(data, in_layout), relax.const(kernel), strides=attrs.strides,
            padding=attrs.padding, dilation=attrs.dilation, groups=groups,
            data_layout=in_layout.name, kernel_layout=kernel_layout, out_layout=out.name,
            out_dtype=attrs.out_dtype)
        out_channels = array.shape[0]
        self._note_padding(var.name, out_channels, out, call)
        return new, out, out_channels

    def _windowed_conv2d(self, call: relax.Call, value: _Value, array: np.ndarray, in_layout: Layout, out: Layout):
        """A grouped conv whose groups do not align with the blocks: blocked, each output block
        reading only its window of input blocks (``pack_windowed_conv_weight``)."""
        attrs, groups = call.attrs, int(call.attrs.groups)
        out_channels, in_per_group = array.shape[:2]
        if groups == 1 or in_layout != out:
            return None
        kernel = pack_windowed_conv_weight(array, groups, out.block, in_layout.padded(value.channels) // out.block)
        self.stats.weight_padding_bytes += (kernel.size - array.size) * array.itemsize
        new = self.builder_.call_te(
            conv2d_nchwc, self._get(call.args[0], in_layout), relax.const(kernel), attrs.strides, attrs.padding,
            attrs.dilation, groups, (in_per_group, out_channels // groups), primfunc_name_hint="conv2d_NCHWc")
        return new, out, out_channels

    def _take(self, call: relax.Call, var: relax.Var):
        """Constant channels taken from blocked data (a channel shuffle): a blocked gather; from a
        concat along C, a gather from its parts (ShuffleNetV2's halves of a shuffled concat: the
        concat itself is then dead, one pass over the feature map fewer). A lookup in a constant
        table is pointwise: it takes its indices' layout."""
        data, indices = call.args
        table = constant_array(data)
        if table is not None and table.ndim == 1:  # a lookup table (passes/quantized/tables.py): pointwise
            value, layout = self._value(indices), self._target(var, [indices])
            if value is None or layout is None:
                return None
            return relax.Call(call.op, [data, self._get(indices, layout)], call.attrs), layout, value.channels
        array = constant_array(indices)
        layout = self._target(var, [data])
        if call.attrs.axis is None or int(call.attrs.axis) % 4 != 1 or array is None or array.ndim != 1 \
                or layout is None:
            return None
        if data in self.concats and self.concats[data][0] == layout:
            _, parts, channels = self.concats[data]
            return self._gather(parts, channels, array, layout, "take_concat_channels"), layout, len(array)
        parts, channels = [self._get(data, layout)], [self._value(data).channels]
        return self._gather(parts, channels, array, layout, "take_channels"), layout, len(array)

    def _gather(self, parts: list[relax.Expr], channels: list[int], source: np.ndarray, layout: Layout,
                name: str) -> relax.Expr:
        """Channels ``source`` of the concatenation of blocked ``parts`` (``gather_channels_nchwc``)."""
        part, local = channel_tables(channels, source, layout.block)
        return self.builder_.call_te(gather_channels_nchwc, parts, relax.const(part), relax.const(local),
                                     primfunc_name_hint=name)

    def _unary(self, call: relax.Call, var: relax.Var):
        value, layout = self._value(call.args[0]), self._target(var, call.args[:1])
        if value is None or layout is None:
            return None
        args = [self._get(call.args[0], layout)] + [self.visit_expr(a) for a in call.args[1:]]
        return self._rebuilt(call, args), layout, value.channels

    def _quantize(self, call: relax.Call, var: relax.Var):
        if any(static_shape(arg) not in ((), (1,)) for arg in call.args[1:]):
            return None  # per channel: its axis would index the blocks
        return self._unary(call, var)

    def _binary(self, call: relax.Call, var: relax.Var):
        shape, layout = batched_shape(call), self._target(var, call.args)
        if shape is None or len(shape) != 4 or layout is None:
            return None
        channels = shape[1]
        pad_value = _BINARY[call.op.name]
        args = []
        for index, arg in enumerate(call.args):
            value, array = self._value(arg), constant_array(arg)
            if value is not None and value.channels == channels and (index == 0 or pad_value == 0.0):
                args.append(self._get(arg, layout))
            elif array is not None and (laid := block_constant(array, channels, layout, pad_value)) is not None:
                args.append(relax.const(laid, str(array.dtype)))
            else:
                return None
        return self._rebuilt(call, args), layout, channels

    def _layer_norm(self, call: relax.Call, var: relax.Var):
        """LayerNorm over C (ConvNeXt's, once ``passes/channels_last.py`` has put it in NCHW) over
        the channel blocks and their lanes, gamma and beta blocked alike; only where the channels
        fill whole blocks (padded lanes would count in the mean)."""
        attrs, (data, gamma, beta) = call.attrs, call.args
        value, scale, shift = self._value(data), constant_array(gamma), constant_array(beta)
        layout = self._target(var, [data])
        if value is None or scale is None or shift is None or [int(a) % 4 for a in attrs.axes] != [1] \
                or layout is None or value.channels % layout.block:
            return None
        blocks = (value.channels // layout.block, layout.block)
        new = relax.op.nn.layer_norm(self._get(data, layout), relax.const(scale.reshape(blocks)),
                                     relax.const(shift.reshape(blocks)), axes=[1, 4], epsilon=attrs.epsilon,
                                     center=attrs.center, scale=attrs.scale)
        return new, layout, value.channels

    def _resize2d(self, call: relax.Call, var: relax.Var):
        """A resize inside the graph runs blocked (each output pixel mixes whole vectors of
        channels: LR-ASPP's upsampled 28 x 28 branch kept a converter pair). One whose result
        leaves the function stays NCHW: converting before an upsampling moves fewer bytes."""
        attrs, layout = call.attrs, self._target(var, call.args[:1])
        if attrs.layout != "NCHW" or not isinstance(var, relax.DataflowVar) or layout is None:
            return None
        value = self._value(call.args[0])
        new = relax.op.image.resize2d(
            self._get(call.args[0], layout), call.args[1], tuple(float(v) for v in attrs.roi), layout.name,
            attrs.method,
            attrs.coordinate_transformation_mode, attrs.rounding_method, attrs.cubic_alpha, attrs.cubic_exclude,
            attrs.extrapolation_value, attrs.out_dtype)
        return new, layout, value.channels

    def _pool(self, call: relax.Call, var: relax.Var):
        attrs, layout = call.attrs, self._target(var, call.args)
        if attrs.layout != "NCHW" or attrs.out_layout != "NCHW" or layout is None:
            return None
        value = self._value(call.args[0])
        data = self._get(call.args[0], layout)
        layouts = {"layout": layout.name, "out_layout": layout.name}
        if call.op.name == "relax.nn.adaptive_avg_pool2d":
            new = relax.op.nn.adaptive_avg_pool2d(data, attrs.output_size, **layouts)
        else:
            new = _POOLS[call.op.name](data, attrs.pool_size, attrs.strides, attrs.padding, attrs.dilation,
                                       attrs.ceil_mode, attrs.count_include_pad, **layouts)
        return new, layout, value.channels

    def _spatial_reduction(self, call: relax.Call, var: relax.Var):
        attrs, layout = call.attrs, self._target(var, call.args)
        axes = sorted(int(a) % 4 for a in attrs.axis) if attrs.axis is not None else None
        if axes != [2, 3] or not attrs.keepdims or layout is None:
            return None
        value = self._value(call.args[0])
        new = _SPATIAL_REDUCTIONS[call.op.name](self._get(call.args[0], layout), axis=[2, 3], keepdims=True)
        return new, layout, value.channels

    def _concat(self, call: relax.Call, var: relax.Var):
        """Concat along C stays blocked. Parts whose channels fill whole blocks (all but the last)
        are concatenated as they are; otherwise every output lane reads its part's channel
        (``gather_channels_nchwc``), so no padding lands between real channels."""
        parts = call.args[0]
        axis = None if call.attrs.axis is None else int(call.attrs.axis) % 4
        if not isinstance(parts, relax.Tuple) or axis not in (1, 2, 3):
            return None
        values, layout = [self._value(p) for p in parts.fields], self._target(var, list(parts.fields))
        if any(v is None for v in values) or layout is None:
            return None
        blocked_parts = [self._get(p, layout) for p in parts.fields]
        if axis != 1:  # along H or W: the same axis of the blocked layout
            return relax.op.concat(blocked_parts, axis=axis), layout, values[0].channels
        channels = [v.channels for v in values]
        self.concats[var] = layout, blocked_parts, channels  # a take from it gathers from the parts (_take)
        if any(c % layout.block for c in channels[:-1]):
            new = self._gather(blocked_parts, channels, np.arange(sum(channels)), layout, "concat_channels")
            return new, layout, sum(channels)
        return relax.op.concat(blocked_parts, axis=1), layout, sum(channels)

    def _layout_transform(self, call: relax.Call, var: relax.Var):
        """A converter already in the graph: its result is an alias of the value it converts."""
        source = call.args[0]
        value, shape = self._value(source), batched_shape(call)
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
            return self._rebuilt(call, [self._get(source)]), STANDARD, shape[1]
        return self._alias(var, value, target)

    def _strided_slice(self, call: relax.Call, var: relax.Var):
        shape = batched_shape(call)
        source = self.unsliced.get(call.args[0])
        if source is None:
            return self._channel_slice(call, var)
        if shape is None or shape[1] != self.values[source].channels:
            return None
        return self._alias(var, self.values[source], STANDARD)

    def _channel_slice(self, call: relax.Call, var: relax.Var):
        """A slice of blocked data along H and W (the same slice of the blocked layout), or along C
        only (ShuffleNetV2's channel split: a blocked gather)."""
        data, value, layout = call.args[0], self._value(call.args[0]), self._target(var, call.args[:1])
        axes, begin, end, *strides = (constant_ints(arg) for arg in call.args[1:])
        if value is None or layout is None or None in (axes, begin, end):
            return None
        if all(a % 4 in (2, 3) for a in axes):  # along H and W: the same axes of the blocked layout
            return self._rebuilt(call, [self._get(data, layout), *call.args[1:]]), layout, value.channels
        if [a % 4 for a in axes] != [1] or strides and strides[0] != [1]:
            return None
        channels = np.arange(value.channels)[begin[0]:end[0]]
        block = layout.block
        if len(channels) and channels[0] % block == 0 and len(channels) % block == 0:
            # whole blocks: the same slice of the blocked axis, a contiguous copy instead of a gather
            blocks = relax.op.strided_slice(self._get(data, layout), axes=[1], begin=[int(channels[0]) // block],
                                            end=[(int(channels[-1]) + 1) // block])
            return blocks, layout, len(channels)
        new = self._gather([self._get(data, layout)], [value.channels], channels, layout, "take_channels")
        return new, layout, len(channels)

    def _alias(self, var: relax.Var, value: _Value, layout: Layout):
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
    rewriter = _Rewriter(mod.clone(), layout, LayoutStats(layout.block), {})
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
        new = rewrite_emitting(mod, _Rewriter(mod.clone(), self.layout, self.stats, plan))  # a copy: see passes/ir.py
        return relax.transform.DeadCodeElimination()(new)
