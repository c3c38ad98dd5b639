"""Quantized additions of two uint8 tensors, as onnxruntime's ``QLinearAdd`` computes them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relax

from relaxc.passes.ir import constant_array, is_op, static_shape
from relaxc.passes.quantized.common import Bindings, Rewriter, fma, rounded, scalar


@dataclass
class AddChain:
    """``quantize(add(dequantize(a), dequantize(b)))`` of uint8 tensors, ``b`` of a's shape or a
    constant broadcast to it (maybe a ReLU the output's zero point 0 already implies), as onnxruntime's
    ``QLinearAdd`` computes it (a broadcast operand is its b, the inputs swapped if need be):
    ``saturate(round_half_even(a ra + (b rb + fixed)))``, ``r = s / sy`` and
    ``fixed = zy - (ra za + rb zb)``, the multiply-adds fused (MLAS's AVX2 kernel)."""

    a: relax.Expr
    b: relax.Expr
    ratios: tuple[np.float32, np.float32]
    fixed: np.float32


def read_add(bindings: Bindings, add: relax.Call, y_scale: float, y_zero: float) -> AddChain | None:
    """The chain of an ``add`` quantized at ``y_scale`` and ``y_zero``; None where it is not one."""
    parts = [bindings.value(arg) for arg in add.args]
    if not all(is_op(p, "relax.dequantize") for p in parts):
        return None
    if static_shape(parts[0]) != static_shape(add):  # the broadcast operand is b, as onnxruntime swaps them
        parts.reverse()
    (a, sa, za), (b, sb, zb) = (p.args for p in parts)
    scalars = [scalar(v) for v in (sa, za, sb, zb)]
    if any(v is None for v in scalars) or str(a.ty.dtype) != "uint8" or str(b.ty.dtype) != "uint8" \
            or static_shape(add) is None or static_shape(a) != static_shape(add) \
            or (static_shape(b) != static_shape(a) and constant_array(b) is None):
        return None  # a computed b broadcast (an attention mask) stays float: fused into the scores'
        # matmul, the integer form's epilogue made Tiled's kernel 10x slower (BERT's, 3 ms)
    sa, za, sb, zb = scalars
    ra, rb = np.float32(sa) / np.float32(y_scale), np.float32(sb) / np.float32(y_scale)
    fixed = np.float32(np.float32(y_zero) - fma(ra, np.float32(za), rb * np.float32(zb)))
    return AddChain(a, b, (ra, rb), fixed)


def added(rewriter: Rewriter, chain: AddChain) -> relax.Expr:
    """The uint8 sum of ``chain``, rounded once."""
    (ra, rb), norm = chain.ratios, rewriter.builder_.normalize

    def floats(expr: relax.Expr) -> relax.Expr:
        return norm(relax.op.astype(rewriter.visit_expr(expr), "float32"))

    b = norm(relax.op.add(norm(relax.op.multiply(floats(chain.b), relax.const(rb))), relax.const(chain.fixed)))
    total = norm(relax.op.add(norm(relax.op.multiply(floats(chain.a), relax.const(ra))), b))
    return rounded(total, 0)
