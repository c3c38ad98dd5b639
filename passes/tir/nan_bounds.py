"""NaN passes through a max or min against a constant (ReLU, Clip, HardSigmoid), as in onnxruntime
(a pass of the ``relaxc`` TIR pipeline, ``passes/tir/tir_pipeline.py``).

LLVM code for a float ``max(a, b)`` is ``a > b ? a : b`` (x86 ``maxps`` likewise returns its second
operand when either is NaN), so TOPI's ``relu(x) = max(x, 0)`` turned a NaN input into 0 where
onnxruntime gives NaN, hiding a broken input. With the constant first, ``max(0, x)`` is
``0 > x ? 0 : x``: NaN when ``x`` is, and the same one instruction. Reductions (ReduceMax, MaxPool)
keep TVM's order: no operand order propagates a NaN through an accumulator, and a NaN-aware max
costs a compare per element (docs/limits.md).

A clamp cast to an integer (``QuantizeLinear``'s ``max(min(x, 255), 0)``) keeps its outer bound in
TVM's order, so a NaN becomes that bound (the type's lowest value, onnxruntime's quantization of a
NaN) instead of reaching the cast: LLVM's conversion of a NaN to an integer is poison, and code
built from it differed by CPU (a fully masked softmax row's quantized probabilities read garbage on
Zen 4 and Zen 5).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx


def _constant(expr: tirx.PrimExpr) -> bool:
    if isinstance(expr, tirx.Broadcast):
        expr = expr.value
    return isinstance(expr, (tirx.FloatImm, tirx.IntImm))


def _constant_first(op: tirx.Max | tirx.Min) -> tirx.PrimExpr:
    if "float" in str(op.a.ty) and _constant(op.b) and not _constant(op.a):
        return type(op)(op.b, op.a)
    return op


def _defined_cast(cast: tirx.Cast) -> tirx.PrimExpr:
    """A float clamp cast to an integer with its outer bound second again: NaN gives the bound."""
    value = cast.value
    if "int" in str(cast.ty) and isinstance(value, (tirx.Max, tirx.Min)) and "float" in str(value.b.ty) \
            and _constant(value.a) and not _constant(value.b):
        return tirx.Cast(str(cast.ty), type(value)(value.b, value.a))
    return cast


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="relaxc.NaNThroughBounds")
def NaNThroughBounds(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tirx.PrimFunc:
    """Every float ``max``/``min`` against a constant written with the constant first, but the
    outer one of a clamp cast to an integer (the map runs bottom-up: the cast sees its clamp swapped)."""
    return tvm_ffi.structural_map(func, [((tirx.Max, tirx.Min), _constant_first), (tirx.Cast, _defined_cast)])
