"""Quantized convolutions and matmuls (``QLinearConv``, ``QLinearMatMul``, ``ConvInteger``): the
products of dequantized uint8 data and int8 weights summed on the integers.

    conv(sx (xq - zx), sw wq) = sx sw (conv(xq, wq) - zx sum(wq))

holds with the spatial padding too when ``zx`` is 0 (padding ``xq`` with 0 is padding ``x`` with
0); otherwise the data is padded with ``zx`` first. A depthwise or grouped convolution sums its few
products in float32 on ``xq - zx``, where every partial sum is an integer below ``FLOAT_EXACT`` (a
group's weights and a bias below half of it). A matmul by constant weights (per column scales) is
the same with ``zx`` times the weights' column sums. A chain up to a uint8 ``quantize``
(``ProductChain``) ends in onnxruntime's requantization; any other product keeps its float
epilogue after the integer sum (``sx sw`` times it, then the model's ops).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

import numpy as np
from tvm import relax

from relaxc.passes.ir import constant_array, is_op, static_shape
from relaxc.passes.quantized import saturated_pairs
from relaxc.passes.quantized.common import FLOAT_EXACT, Bindings, Rewriter, rounded, scalar


@dataclass
class Operands:
    """A convolution or matmul of dequantized uint8 data and int8 weights (zero point 0), read off
    the graph."""

    conv: relax.Call  # a conv2d or a matmul
    data: relax.Expr  # the uint8 tensor
    x_zero: int | relax.Expr  # a constant, or a scalar computed at run time (ConvInteger's)
    weights: np.ndarray  # int8, OIHW or (K, N)
    scale: np.ndarray  # float32 ``sx * sw`` per output channel

    def per_channel(self, values: np.ndarray) -> np.ndarray:
        """Values per output channel shaped to broadcast along the output's channel axis."""
        return values.reshape(-1) if is_op(self.conv, "relax.matmul") else values.reshape(1, -1, 1, 1)


@dataclass
class ProductChain:
    """A quantized convolution up to the uint8 ``quantize`` of its result, in the form onnxruntime
    fuses into a ``QLinearConv``: ``clamp(round_half_even(float32(sum + bq) * m), -zy, 255 - zy) +
    zy`` with ``m = float32(sx * sw) / sy`` per output channel (MLAS's requantization), a ReLU
    folded into the lower bound."""

    operands: Operands
    bias: np.ndarray | None  # int32 per output channel
    relu: bool
    y_scale: float
    y_zero: int


def _computed_scalar(expr: relax.Expr) -> bool:
    """A scalar uint8 value computed at run time (``DynamicQuantizeLinear``'s zero point)."""
    shape = static_shape(expr)
    return constant_array(expr) is None and shape is not None and math.prod(shape) == 1 \
        and str(expr.ty.dtype) == "uint8"


def _depthwise(weights: np.ndarray, groups: int) -> bool:
    """One input and one output channel a group: onnxruntime's depthwise kernel, which sums exactly."""
    return weights.shape[1] == 1 and weights.shape[0] == groups


def _in_float(weights: np.ndarray, groups: int, saturated: bool) -> bool:
    """Whether a grouped or depthwise convolution sums in float32 (exact below ``FLOAT_EXACT``): all
    but the grouped ones whose byte products pair (``saturated_pairs.grouped_in_pairs``)."""
    return groups > 1 and not (saturated and not _depthwise(weights, groups))


def read_operands(bindings: Bindings, call: relax.Call, refused: collections.Counter,
             saturated: bool) -> Operands | None:
    """The operands of a conv2d or matmul of dequantized uint8 data and int8 weights; None, the
    reason counted in ``refused``, for a product of dequantized tensors of any other form."""
    data, weight = (bindings.value(arg) for arg in call.args)
    attrs, matmul = call.attrs, is_op(call, "relax.matmul")
    transposed = matmul and is_op(weight, "relax.permute_dims") and [int(a) for a in weight.attrs.axes] == [1, 0]
    if transposed:  # a Gemm's transB
        weight = bindings.value(weight.args[0])
    if not is_op(data, "relax.dequantize") or not is_op(weight, "relax.dequantize"):
        return None
    xq, sx, zx = data.args
    wq, sw, zw = weight.args
    weights, scales, weight_zeros = constant_array(wq), constant_array(sw), constant_array(zw)
    if transposed and weights is not None and weights.ndim == 2:
        weights = weights.T
    x_scale, x_zero = scalar(sx), scalar(zx)
    if x_zero is None and not matmul and _computed_scalar(zx):
        x_zero = zx
    shape = static_shape(call)
    why = None
    if shape is None or (not matmul and (attrs.data_layout, attrs.kernel_layout) != ("NCHW", "OIHW")):
        why = "a layout other than NCHW/OIHW"
    elif matmul and (weights is None or weights.ndim != 2 or scales is None or scales.size not in (1, shape[-1])):
        why = "a matmul of two computed tensors" if weights is None else "a matmul with weights not a matrix"
    elif str(xq.ty.dtype) != "uint8":
        why = f"{xq.ty.dtype} data (uint8 only)"
    elif weights is None or weights.dtype != np.int8 or scales is None or weight_zeros is None:
        why = "weights not a constant int8 tensor with constant scales"
    elif np.any(weight_zeros != 0):
        why = "weights with a zero point other than 0"
    elif scales.size > 1 and int(weight.attrs.axis) % weights.ndim != (1 if matmul and not transposed else 0):
        why = "weights scaled along an axis other than the output channels'"
    elif x_scale is None or x_zero is None:
        why = "data with per-channel or variable scale or zero point"
    elif not matmul and _in_float(weights, int(attrs.groups), saturated) \
            and weights[0].size * 255 * 128 >= FLOAT_EXACT // 2:
        why = "a grouped convolution whose sums can leave float32's exact integers"
    if why is not None:
        refused[why] += 1
        return None
    channels = shape[-1] if matmul else shape[1]
    scale = (np.float32(x_scale) * np.broadcast_to(scales.astype(np.float32), (channels,))).astype(np.float32)
    return Operands(call, xq, x_zero if isinstance(x_zero, relax.Expr) else int(x_zero), weights, scale)


def read_bias(bindings: Bindings, expr: relax.Expr, operands: Operands) -> np.ndarray | None:
    """A bias ``DequantizeLinear(bq)`` at scale ``sx * sw``, as int32 ``bq``; None otherwise."""
    if is_op(expr, "relax.reshape"):
        expr = bindings.value(expr.args[0])
    if not is_op(expr, "relax.dequantize"):
        return None
    values, scales, zeros = (constant_array(a) for a in expr.args)
    channels = operands.scale.size
    if values is None or values.dtype != np.int32 or values.size != channels or scales is None \
            or zeros is None or np.any(zeros != 0) \
            or not np.array_equal(np.broadcast_to(scales, (channels,)), operands.scale):
        return None
    return values.reshape(channels)


def requantized(rewriter: Rewriter, chain: ProductChain) -> relax.Expr:
    """A chain's integer sum requantized to uint8 as onnxruntime's ``QLinearConv`` does."""
    operands = chain.operands
    multiplier = operands.per_channel((operands.scale / np.float32(chain.y_scale)).astype(np.float32))
    scaled = rewriter.builder_.normalize(relax.op.multiply(rewriter.builder_.normalize(
        integer_sum(rewriter, operands, chain.bias)), relax.const(multiplier)))
    if chain.relu:
        scaled = rewriter.builder_.normalize(relax.op.nn.relu(scaled))
    return rounded(scaled, chain.y_zero)  # clamped after rounding, not before: one (integer bounds)


def unrequantized(rewriter: Rewriter, operands: Operands) -> relax.Expr:
    """A product not requantized: its exact integer sum times ``sx sw``, in float32."""
    return relax.op.multiply(rewriter.builder_.normalize(integer_sum(rewriter, operands, exact=True)),
                             relax.const(operands.per_channel(operands.scale)))


def integer_sum(rewriter: Rewriter, operands: Operands, bias: np.ndarray | None = None,
                exact: bool = False) -> relax.Expr:
    """``float32(conv(xq, wq) - zx sum(wq) + bias)`` (or the matmul's), the integer sum rounded
    once to float as onnxruntime rounds it. A convolution whose result is not requantized (a
    ``ConvInteger``, a float output) sums ``exact``ly, as onnxruntime computes those, also where
    the byte dot product saturates pairs (``saturated_pairs.nibbles``)."""
    attrs, builder = operands.conv.attrs, rewriter.builder_
    norm = builder.normalize
    channels = operands.scale.size
    data = rewriter.visit_expr(operands.data)
    offset = np.zeros(channels, np.int64) if bias is None else bias.astype(np.int64)
    exact = exact or rewriter.exact
    if is_op(operands.conv, "relax.matmul"):
        offset = offset - operands.x_zero * operands.weights.astype(np.int64).sum(axis=0)
        weights = relax.const(np.ascontiguousarray(operands.weights))
        product = lambda data: norm(relax.op.matmul(data, weights, out_dtype="int32"))  # noqa: E731
        total = saturated_pairs.nibbles(builder, data, product) if rewriter.saturated_pairs and rewriter.exact \
            else product(data)
        if np.any(offset != 0):
            total = norm(relax.op.add(total, relax.const(offset.astype(np.int32))))
        return relax.op.astype(total, "float32")
    padding = [int(p) for p in attrs.padding]
    offset = offset.reshape(1, channels, 1, 1)
    groups = int(attrs.groups)
    pairs = rewriter.saturated_pairs and not exact and not _depthwise(operands.weights, groups)
    if _in_float(operands.weights, groups, rewriter.saturated_pairs):  # every partial sum exact in float32
        floats = norm(relax.op.astype(data, "float32"))
        if isinstance(operands.x_zero, relax.Expr) or operands.x_zero:  # xq - zx, padded with 0 as x is
            floats = norm(relax.op.subtract(floats, _zero(rewriter, operands.x_zero, "float32")))
        total = norm(relax.op.nn.conv2d(
            floats, relax.const(operands.weights.astype(np.float32)), strides=attrs.strides, padding=padding,
            dilation=attrs.dilation, groups=attrs.groups))
        if not np.any(offset):
            return total
        if operands.weights[0].size * 255 * 128 + np.abs(offset).max() < FLOAT_EXACT:
            return relax.op.add(total, relax.const(offset.astype(np.float32)))
        total = norm(relax.op.add(norm(relax.op.astype(total, "int32")), relax.const(offset.astype(np.int32))))
        return relax.op.astype(total, "float32")  # a large bias: added to the integers, rounded once
    weights = operands.weights
    sums = weights.astype(np.int64).sum(axis=(1, 2, 3)).reshape(offset.shape)
    grouped = groups > 1  # here: in pairs computed apart (grouped_in_pairs), exact too by nibbles
    taps = (pairs and weights.shape[1] % 2 == 1 or grouped) and weights.shape[2] * weights.shape[3] > 1
    if isinstance(operands.x_zero, relax.Expr):
        data = _padded_with(rewriter, data, padding, operands.x_zero) if any(padding) else data
        padding = [0, 0, 0, 0]
    elif (operands.x_zero != 0 or taps) and any(padding):
        data = norm(relax.op.nn.pad(data, [0, 0, 0, 0, padding[0], padding[2], padding[1], padding[3]],
                                    pad_value=float(operands.x_zero)))
        padding = [0, 0, 0, 0]
    strides = [int(s) for s in attrs.strides]
    if taps:
        data, weights = saturated_pairs.taps_as_channels(builder, data, weights, strides,
                                                         [int(d) for d in attrs.dilation],
                                                         static_shape(operands.conv)[2:], groups)
        strides = [1, 1]

    def conv(data: relax.Expr) -> relax.Expr:
        if grouped:
            return saturated_pairs.grouped_in_pairs(builder, data, weights, groups, strides)
        return norm(relax.op.nn.conv2d(
            data, relax.const(np.ascontiguousarray(weights)), strides=strides, padding=padding,
            dilation=[1, 1] if taps else attrs.dilation, out_dtype="int32"))

    total = saturated_pairs.nibbles(builder, data, conv) if rewriter.saturated_pairs and not pairs else conv(data)
    if isinstance(operands.x_zero, relax.Expr):  # zx sum(wq), a vector computed at run time
        total = norm(relax.op.subtract(total, norm(relax.op.multiply(
            _zero(rewriter, operands.x_zero, "int32"), relax.const(sums.astype(np.int32))))))
    else:
        offset = offset - operands.x_zero * sums
    if np.any(offset != 0):
        total = norm(relax.op.add(total, relax.const(offset.astype(np.int32))))
    return relax.op.astype(total, "float32")


def _zero(rewriter: Rewriter, zero: int | relax.Expr, dtype: str) -> relax.Expr:
    """A zero point, constant or computed at run time, as ``dtype``."""
    if not isinstance(zero, relax.Expr):
        return relax.const(np.array(zero, dtype))
    return rewriter.builder_.normalize(relax.op.astype(rewriter.visit_expr(zero), dtype))


def _padded_with(rewriter: Rewriter, data: relax.Expr, padding: list[int], zero: relax.Expr) -> relax.Expr:
    """``data`` padded spatially with a zero point computed at run time: padded with 0, then
    the border (a constant mask) set to ``zero``."""
    norm, (_, _, height, width) = rewriter.builder_.normalize, static_shape(data)
    widths = [0, 0, 0, 0, padding[0], padding[2], padding[1], padding[3]]
    border = np.pad(np.zeros((1, 1, height, width), bool), [(0, 0), (0, 0), (padding[0], padding[2]),
                                                              (padding[1], padding[3])], constant_values=True)
    padded = norm(relax.op.nn.pad(data, widths, pad_value=0.0))
    return norm(relax.op.where(relax.const(border), rewriter.visit_expr(zero), padded))
