"""Quantized pooling and reshapes on the uint8 tensor: max pooling and reshapes at one scale move
values exactly, average pooling rounds as onnxruntime's int8 pooling rounds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relax

from relaxc.passes.ir import is_op, static_shape
from relaxc.passes.quantized.common import Bindings, Rewriter, rounded, scalar

# ops for which quantize(op(dequantize(x))) is op(x) when both use one scale and zero point
MOVES = ("relax.nn.max_pool2d", "relax.reshape")


@dataclass
class Moved:
    """``quantize(op(dequantize(x)))`` at the same scale and zero point, ``op`` one that only moves
    or selects values (max pooling, reshapes): ``op(x)`` on the uint8 tensor itself, exactly, as
    onnxruntime runs such ops on the integers."""

    op: relax.Call
    data: relax.Expr


@dataclass
class Averaged:
    """``quantize(pool(dequantize(x)))`` of an average pooling, as onnxruntime's int8 kernels
    compute it. Windows (``avg_pool2d``, ``QLinearAveragePool``): the dequantized values summed in
    window order and divided by the count, then ``round_half_even(average / sy + zy)``, the zero
    point added before rounding (``QuantizeLinear`` adds it after: one step apart at exact halves
    with an odd zero point). Global (``QLinearGlobalAveragePool``): ``sum(xq) - zx n`` requantized
    with ``m = sx / (sy n)`` as a convolution is."""

    pool: relax.Call
    data: relax.Expr  # the uint8 tensor
    scales: tuple[float, float]  # sx, sy
    zeros: tuple[int, int]  # zx, zy


def read_pooling(bindings: Bindings, value: relax.Expr, scale: float, zero: float) -> Moved | Averaged | None:
    """The chain of ``value``, quantized at ``scale`` and ``zero``, where it moves or averages a
    dequantized uint8 tensor; None otherwise."""
    if any(is_op(value, op) for op in MOVES):
        moved = bindings.value(value.args[0])
        if is_op(moved, "relax.dequantize") and str(moved.args[0].ty.dtype) == "uint8" \
                and (scalar(moved.args[1]), scalar(moved.args[2])) == (scale, zero):
            return Moved(value, moved.args[0])
    if is_op(value, "relax.nn.avg_pool2d") or _global_average(value):
        source = bindings.value(value.args[0])
        if is_op(source, "relax.dequantize") and str(source.args[0].ty.dtype) == "uint8" \
                and None not in (scalar(source.args[1]), scalar(source.args[2])):
            return Averaged(value, source.args[0], (scalar(source.args[1]), scale),
                            (int(scalar(source.args[2])), int(zero)))
    return None


def moved(rewriter: Rewriter, chain: Moved) -> relax.Expr:
    """The op of ``chain`` on its uint8 tensor."""
    return relax.Call(chain.op.op, [rewriter.visit_expr(chain.data), *chain.op.args[1:]], chain.op.attrs)


def averaged(rewriter: Rewriter, chain: Averaged) -> relax.Expr:
    """The uint8 average of ``chain``, rounded as onnxruntime's int8 pooling rounds it."""
    norm, pool = rewriter.builder_.normalize, chain.pool
    (x_scale, y_scale), (x_zero, y_zero) = chain.scales, chain.zeros
    if is_op(pool, "relax.mean"):
        integers = norm(relax.op.astype(rewriter.visit_expr(chain.data), "int32"))
        total = norm(relax.op.sum(integers, axis=pool.attrs.axis, keepdims=pool.attrs.keepdims))
        count = int(np.prod(static_shape(chain.data)[2:]))
        centred = norm(relax.op.subtract(total, relax.const(np.int32(x_zero * count))))
        multiplier = np.float32(np.float32(x_scale) / (np.float32(y_scale) * np.float32(count)))
        scaled = norm(relax.op.multiply(norm(relax.op.astype(centred, "float32")), relax.const(multiplier)))
        return rounded(scaled, y_zero)
    average = norm(_windows_as_onnxruntime(pool, rewriter.visit_expr(pool.args[0])))
    shifted = norm(relax.op.add(norm(relax.op.divide(average, relax.const(np.float32(y_scale)))),
                                relax.const(np.float32(y_zero))))
    return rounded(shifted, 0)


def _windows_as_onnxruntime(pool: relax.Call, data: relax.Expr) -> relax.Expr:
    """``pool`` (an ``avg_pool2d``) on ``data`` as ``QLinearAveragePool`` divides: counting the
    padding, by the whole window, the last window of a ceil-mode pooling too (the float operator
    counts only its part inside the padded input), so the end padding is extended over it."""
    attrs = pool.attrs
    if not (attrs.ceil_mode and attrs.count_include_pad):
        return relax.Call(pool.op, [data], attrs)
    size, out = static_shape(pool.args[0])[2:], static_shape(pool)[2:]
    pads = [int(p) for p in attrs.padding]
    for axis in range(2):
        reach = (out[axis] - 1) * int(attrs.strides[axis]) + (int(attrs.pool_size[axis]) - 1) * \
            int(attrs.dilation[axis]) + 1
        pads[2 + axis] = max(pads[2 + axis], reach - size[axis] - pads[axis])
    return relax.op.nn.avg_pool2d(data, attrs.pool_size, attrs.strides, pads, attrs.dilation, ceil_mode=False,
                                  count_include_pad=True, layout=attrs.layout, out_layout=attrs.out_layout)


def _global_average(call: relax.Expr) -> bool:
    """Whether ``call`` is a global average pooling (imported as a mean over H and W, kept)."""
    shape = static_shape(call.args[0]) if is_op(call, "relax.mean") else None
    return shape is not None and len(shape) == 4 and bool(call.attrs.keepdims) \
        and sorted(int(a) % 4 for a in call.attrs.axis) == [2, 3]
