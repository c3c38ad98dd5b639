"""How each operator runs in a blocked layout: the rules the layout pass (``passes/layout.py``)
applies to the ops it can keep blocked.

A rule gets the walk, the call and the variable it binds, and returns the call rewritten (its
arguments fetched in the layout it runs in), that layout and the real channel count of its result;
or None, and the op runs in the standard layout on standard data. An op runs in the layout the plan
gives it (``passes/layout_choice.py``), else in its first blocked argument's (``Rewriter.target``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np
from tvm import relax

from relaxc.passes.ir import batched_shape, constant_array, constant_ints, static_shape
from relaxc.passes.layout_algebra import (Layout, block_constant, blocked, input_block, pack_conv_weight,
                                         pack_windowed_conv_weight)
from relaxc.passes.legalize import channel_tables, conv2d_nchwc, gather_channels_nchwc

if TYPE_CHECKING:
    from relaxc.passes.layout import Rewriter, Value

Result = tuple[relax.Expr, Layout, int] | None  # the new call, its layout, its real channels

_UNARY = {"relax.nn.relu", "relax.clip", "relax.sigmoid", "relax.tanh", "relax.erf", "relax.nn.silu",
          "relax.nn.leakyrelu", "relax.astype"}
# Binary pointwise ops and the value padded channels of a constant operand get.
_BINARY = {"relax.add": 0.0, "relax.subtract": 0.0, "relax.multiply": 0.0, "relax.maximum": 0.0,
           "relax.minimum": 0.0, "relax.divide": 1.0}
_QUANTIZE = {"relax.quantize", "relax.dequantize"}  # pointwise where the scale and zero point are one each
# fused into their producer: cost nothing of their own
ELEMENTWISE = frozenset(_UNARY) | frozenset(_BINARY) | frozenset(_QUANTIZE)
_POOLS = {"relax.nn.max_pool2d": relax.op.nn.max_pool2d, "relax.nn.avg_pool2d": relax.op.nn.avg_pool2d,
          "relax.nn.adaptive_avg_pool2d": relax.op.nn.adaptive_avg_pool2d}
_SPATIAL_REDUCTIONS = {"relax.mean": relax.op.mean, "relax.sum": relax.op.sum, "relax.max": relax.op.max,
                       "relax.min": relax.op.min}


def rebuilt(call: relax.Call, args: list[relax.Expr]) -> relax.Call:
    """``call`` with ``args`` for its arguments."""
    return relax.Call(call.op, args, call.attrs, call.ty_args)


def _conv2d(walk: Rewriter, call: relax.Call, var: relax.Var) -> Result:
    attrs = call.attrs
    if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCHW", "OIHW", "NCHW"):
        return None
    data, weight = call.args
    value, array = walk.tracked(data), constant_array(weight)
    out = walk.plan.get(var, walk.layout)
    if value is None or array is None or out.standard:
        return None
    # blocked input: read in the conv's own layout (the cost the layout choice assumes)
    depth = 4 if str(data.ty.dtype) in ("uint8", "int8") else 1
    in_layout = out if not value.home.standard else blocked(input_block(value.channels, out.block, depth))
    packed = pack_conv_weight(array, int(attrs.groups), in_layout.block, out.block)
    if packed is None:
        return _windowed_conv2d(walk, call, value, array, in_layout, out)
    kernel, kernel_layout, groups = packed
    walk.stats.weight_padding_bytes += (kernel.size - array.size) * array.itemsize
    new = relax.op.nn.conv2d(
        walk.get(data, in_layout), relax.const(kernel), strides=attrs.strides,
        padding=attrs.padding, dilation=attrs.dilation, groups=groups,
        data_layout=in_layout.name, kernel_layout=kernel_layout, out_layout=out.name,
        out_dtype=attrs.out_dtype)
    out_channels = array.shape[0]
    walk.note_padding(var.name, out_channels, out, call)
    return new, out, out_channels


def _windowed_conv2d(walk: Rewriter, call: relax.Call, value: Value, array: np.ndarray, in_layout: Layout,
                     out: Layout) -> Result:
    """A grouped conv whose groups do not align with the blocks: blocked, each output block
    reading only its window of input blocks (``pack_windowed_conv_weight``)."""
    attrs, groups = call.attrs, int(call.attrs.groups)
    out_channels, in_per_group = array.shape[:2]
    if groups == 1 or in_layout != out:
        return None
    kernel = pack_windowed_conv_weight(array, groups, out.block, in_layout.padded(value.channels) // out.block)
    walk.stats.weight_padding_bytes += (kernel.size - array.size) * array.itemsize
    new = walk.builder_.call_te(
        conv2d_nchwc, walk.get(call.args[0], in_layout), relax.const(kernel), attrs.strides, attrs.padding,
        attrs.dilation, groups, (in_per_group, out_channels // groups), primfunc_name_hint="conv2d_NCHWc")
    return new, out, out_channels


def _take(walk: Rewriter, call: relax.Call, var: relax.Var) -> Result:
    """Constant channels taken from blocked data (a channel shuffle): a blocked gather; from a
    concat along C, a gather from its parts (ShuffleNetV2's halves of a shuffled concat: the
    concat itself is then dead, one pass over the feature map fewer). A lookup in a constant
    table is pointwise: it takes its indices' layout."""
    data, indices = call.args
    table = constant_array(data)
    if table is not None and table.ndim == 1:  # a lookup table (passes/quantized/tables.py): pointwise
        value, layout = walk.tracked(indices), walk.target(var, [indices])
        if value is None or layout is None:
            return None
        return relax.Call(call.op, [data, walk.get(indices, layout)], call.attrs), layout, value.channels
    array = constant_array(indices)
    layout = walk.target(var, [data])
    if call.attrs.axis is None or int(call.attrs.axis) % 4 != 1 or array is None or array.ndim != 1 \
            or layout is None:
        return None
    if data in walk.concats and walk.concats[data][0] == layout:
        _, parts, channels = walk.concats[data]
        return _gather(walk, parts, channels, array, layout, "take_concat_channels"), layout, len(array)
    parts, channels = [walk.get(data, layout)], [walk.tracked(data).channels]
    return _gather(walk, parts, channels, array, layout, "take_channels"), layout, len(array)


def _gather(walk: Rewriter, parts: list[relax.Expr], channels: list[int], source: np.ndarray, layout: Layout,
            name: str) -> relax.Expr:
    """Channels ``source`` of the concatenation of blocked ``parts`` (``gather_channels_nchwc``)."""
    part, local = channel_tables(channels, source, layout.block)
    return walk.builder_.call_te(gather_channels_nchwc, parts, relax.const(part), relax.const(local),
                                 primfunc_name_hint=name)


def _unary(walk: Rewriter, call: relax.Call, var: relax.Var) -> Result:
    value, layout = walk.tracked(call.args[0]), walk.target(var, call.args[:1])
    if value is None or layout is None:
        return None
    args = [walk.get(call.args[0], layout)] + [walk.visit_expr(a) for a in call.args[1:]]
    return rebuilt(call, args), layout, value.channels


def _quantize(walk: Rewriter, call: relax.Call, var: relax.Var) -> Result:
    if any(static_shape(arg) not in ((), (1,)) for arg in call.args[1:]):
        return None  # per channel: its axis would index the blocks
    return _unary(walk, call, var)


def _binary(walk: Rewriter, call: relax.Call, var: relax.Var) -> Result:
    shape, layout = batched_shape(call), walk.target(var, call.args)
    if shape is None or len(shape) != 4 or layout is None:
        return None
    channels = shape[1]
    pad_value = _BINARY[call.op.name]
    args = []
    for index, arg in enumerate(call.args):
        value, array = walk.tracked(arg), constant_array(arg)
        if value is not None and value.channels == channels and (index == 0 or pad_value == 0.0):
            args.append(walk.get(arg, layout))
        elif array is not None and (laid := block_constant(array, channels, layout, pad_value)) is not None:
            args.append(relax.const(laid, str(array.dtype)))
        else:
            return None
    return rebuilt(call, args), layout, channels


def _layer_norm(walk: Rewriter, call: relax.Call, var: relax.Var) -> Result:
    """LayerNorm over C (ConvNeXt's, once ``passes/channels_last.py`` has put it in NCHW) over
    the channel blocks and their lanes, gamma and beta blocked alike; only where the channels
    fill whole blocks (padded lanes would count in the mean)."""
    attrs, (data, gamma, beta) = call.attrs, call.args
    value, scale, shift = walk.tracked(data), constant_array(gamma), constant_array(beta)
    layout = walk.target(var, [data])
    if value is None or scale is None or shift is None or [int(a) % 4 for a in attrs.axes] != [1] \
            or layout is None or value.channels % layout.block:
        return None
    blocks = (value.channels // layout.block, layout.block)
    new = relax.op.nn.layer_norm(walk.get(data, layout), relax.const(scale.reshape(blocks)),
                                 relax.const(shift.reshape(blocks)), axes=[1, 4], epsilon=attrs.epsilon,
                                 center=attrs.center, scale=attrs.scale)
    return new, layout, value.channels


def _resize2d(walk: Rewriter, call: relax.Call, var: relax.Var) -> Result:
    """A resize inside the graph runs blocked (each output pixel mixes whole vectors of
    channels: LR-ASPP's upsampled 28 x 28 branch kept a converter pair). One whose result
    leaves the function stays NCHW: converting before an upsampling moves fewer bytes."""
    attrs, layout = call.attrs, walk.target(var, call.args[:1])
    if attrs.layout != "NCHW" or not isinstance(var, relax.DataflowVar) or layout is None:
        return None
    value = walk.tracked(call.args[0])
    new = relax.op.image.resize2d(
        walk.get(call.args[0], layout), call.args[1], tuple(float(v) for v in attrs.roi), layout.name,
        attrs.method,
        attrs.coordinate_transformation_mode, attrs.rounding_method, attrs.cubic_alpha, attrs.cubic_exclude,
        attrs.extrapolation_value, attrs.out_dtype)
    return new, layout, value.channels


def _pool(walk: Rewriter, call: relax.Call, var: relax.Var) -> Result:
    attrs, layout = call.attrs, walk.target(var, call.args)
    if attrs.layout != "NCHW" or attrs.out_layout != "NCHW" or layout is None:
        return None
    value = walk.tracked(call.args[0])
    data = walk.get(call.args[0], layout)
    layouts = {"layout": layout.name, "out_layout": layout.name}
    if call.op.name == "relax.nn.adaptive_avg_pool2d":
        new = relax.op.nn.adaptive_avg_pool2d(data, attrs.output_size, **layouts)
    else:
        new = _POOLS[call.op.name](data, attrs.pool_size, attrs.strides, attrs.padding, attrs.dilation,
                                   attrs.ceil_mode, attrs.count_include_pad, **layouts)
    return new, layout, value.channels


def _spatial_reduction(walk: Rewriter, call: relax.Call, var: relax.Var) -> Result:
    attrs, layout = call.attrs, walk.target(var, call.args)
    axes = sorted(int(a) % 4 for a in attrs.axis) if attrs.axis is not None else None
    if axes != [2, 3] or not attrs.keepdims or layout is None:
        return None
    value = walk.tracked(call.args[0])
    new = _SPATIAL_REDUCTIONS[call.op.name](walk.get(call.args[0], layout), axis=[2, 3], keepdims=True)
    return new, layout, value.channels


def _concat(walk: Rewriter, call: relax.Call, var: relax.Var) -> Result:
    """Concat along C stays blocked. Parts whose channels fill whole blocks (all but the last)
    are concatenated as they are; otherwise every output lane reads its part's channel
    (``gather_channels_nchwc``), so no padding lands between real channels."""
    parts = call.args[0]
    axis = None if call.attrs.axis is None else int(call.attrs.axis) % 4
    if not isinstance(parts, relax.Tuple) or axis not in (1, 2, 3):
        return None
    values, layout = [walk.tracked(p) for p in parts.fields], walk.target(var, list(parts.fields))
    if any(v is None for v in values) or layout is None:
        return None
    blocked_parts = [walk.get(p, layout) for p in parts.fields]
    if axis != 1:  # along H or W: the same axis of the blocked layout
        return relax.op.concat(blocked_parts, axis=axis), layout, values[0].channels
    channels = [v.channels for v in values]
    walk.concats[var] = layout, blocked_parts, channels  # a take from it gathers from the parts (_take)
    if any(c % layout.block for c in channels[:-1]):
        new = _gather(walk, blocked_parts, channels, np.arange(sum(channels)), layout, "concat_channels")
        return new, layout, sum(channels)
    return relax.op.concat(blocked_parts, axis=1), layout, sum(channels)


def channel_slice(walk: Rewriter, call: relax.Call, var: relax.Var) -> Result:
    """A slice of blocked data along H and W (the same slice of the blocked layout), or along C
    only (ShuffleNetV2's channel split: a blocked gather)."""
    data, value, layout = call.args[0], walk.tracked(call.args[0]), walk.target(var, call.args[:1])
    axes, begin, end, *strides = (constant_ints(arg) for arg in call.args[1:])
    if value is None or layout is None or None in (axes, begin, end):
        return None
    if all(a % 4 in (2, 3) for a in axes):  # along H and W: the same axes of the blocked layout
        return rebuilt(call, [walk.get(data, layout), *call.args[1:]]), layout, value.channels
    if [a % 4 for a in axes] != [1] or strides and strides[0] != [1]:
        return None
    channels = np.arange(value.channels)[begin[0]:end[0]]
    block = layout.block
    if len(channels) and channels[0] % block == 0 and len(channels) % block == 0:
        # whole blocks: the same slice of the blocked axis, a contiguous copy instead of a gather
        blocks = relax.op.strided_slice(walk.get(data, layout), axes=[1], begin=[int(channels[0]) // block],
                                        end=[(int(channels[-1]) + 1) // block])
        return blocks, layout, len(channels)
    new = _gather(walk, [walk.get(data, layout)], [value.channels], channels, layout, "take_channels")
    return new, layout, len(channels)


def _rules() -> dict[str, Callable[[Rewriter, relax.Call, relax.Var], Result]]:
    """Each op name's rule."""
    rules = {"relax.nn.conv2d": _conv2d, "relax.concat": _concat, "relax.take": _take,
             "relax.nn.layer_norm": _layer_norm, "relax.image.resize2d": _resize2d}
    rules.update({op: _unary for op in _UNARY})
    rules.update({op: _quantize for op in _QUANTIZE})
    rules.update({op: _binary for op in _BINARY})
    rules.update({op: _pool for op in _POOLS})
    rules.update({op: _spatial_reduction for op in _SPATIAL_REDUCTIONS})
    return rules


RULES = _rules()  # by op name; ``relax.strided_slice`` goes through the walk first (converters' slices)
