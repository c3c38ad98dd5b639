"""NaN passes through a max or min against a constant (ReLU, Clip, HardSigmoid), as in onnxruntime
(a pass of the ``relaxc`` TIR pipeline, ``passes/tir_pipeline.py``).

LLVM code for a float ``max(a, b)`` is ``a > b ? a : b`` (x86 ``maxps`` likewise returns its second
operand when either is NaN), so TOPI's ``relu(x) = max(x, 0)`` turned a NaN input into 0 where
onnxruntime gives NaN, hiding a broken input. With the constant first, ``max(0, x)`` is
``0 > x ? 0 : x``: NaN when ``x`` is, and the same one instruction. Reductions (ReduceMax, MaxPool)
keep TVM's order: no operand order propagates a NaN through an accumulator, and a NaN-aware max
costs a compare per element (docs/limits.md).
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


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="relaxc.NaNThroughBounds")
def NaNThroughBounds(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tirx.PrimFunc:
    """Every float ``max``/``min`` against a constant written with the constant first."""
    return tvm_ffi.structural_map(func, ((tirx.Max, tirx.Min), _constant_first))
