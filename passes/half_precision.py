"""Half-precision reductions accumulate in float32.

A float16 or bfloat16 matmul, sum, mean, softmax or normalisation legalised as is accumulates in
its own type: every partial sum rounds to 11 (bfloat16: 8) significant bits, and a 64-term dot
product drifts several ulps from the exact result. ONNX's reference and onnxruntime accumulate
in float32 and round once at the end, as numpy does for half types; so does relaxc: the operands
are cast to float32, the operator runs there, and its result is cast back. Softmax runs as ONNX
defines it, each step rounded to the half type and only its sum in float32: that is what ONNX's
reference computes (a softmax wholly in float32 differed from it by an ulp). Elementwise operators
are left alone: each rounds once either way.
"""

from __future__ import annotations

import tvm
from tvm import relax

from relaxc.passes.ir import MutatorPass

HALF = ("float16", "bfloat16")
ACCUMULATING = {"relax.matmul", "relax.sum", "relax.mean", "relax.variance", "relax.std", "relax.prod",
                "relax.nn.softmax", "relax.nn.log_softmax", "relax.nn.layer_norm", "relax.nn.rms_norm",
                "relax.nn.group_norm", "relax.nn.instance_norm", "relax.nn.conv1d", "relax.nn.conv2d",
                "relax.nn.conv3d", "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d", "relax.cumsum"}


def _dtype(expr: relax.Expr) -> str | None:
    dtype = getattr(expr.ty, "dtype", None)
    return None if dtype is None else str(dtype)


@relax.expr_functor.mutator
class _Widen(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name in ACCUMULATING):
            return call
        dtype = _dtype(call)
        if dtype not in HALF or any(_dtype(arg) not in (dtype, None) for arg in call.args):
            return call
        if call.op.name == "relax.nn.softmax":
            return self._softmax(call.args[0], int(call.attrs.axis), dtype)
        args = [relax.op.astype(arg, "float32") if _dtype(arg) == dtype else arg for arg in call.args]
        if call.op.name == "relax.matmul":
            wide = relax.op.matmul(*args, out_dtype="float32")
        elif call.op.name == "relax.cumsum":
            wide = relax.op.cumsum(args[0], call.attrs.axis, "float32", call.attrs.exclusive)
        else:
            wide = relax.Call(call.op, args, call.attrs, call.ty_args)
        return relax.op.astype(self.builder_.normalize(wide), dtype)

    def _softmax(self, x: relax.Expr, axis: int, dtype: str) -> relax.Expr:
        """ONNX's definition step by step, each step rounded to the half type, the sum in float32."""
        shifted = self.builder_.emit(relax.op.subtract(x, relax.op.max(x, [axis], keepdims=True)))
        exp = self.builder_.emit(relax.op.exp(shifted))
        total = relax.op.astype(relax.op.sum(relax.op.astype(exp, "float32"), [axis], keepdims=True), dtype)
        return relax.op.divide(exp, total)


@tvm.transform.module_pass(opt_level=0, name="relaxc.AccumulateHalfInFloat32")
class AccumulateHalfInFloat32(MutatorPass):
    """Reductions of float16/bfloat16 tensors computed in float32, rounded once at the end."""

    mutator = _Widen
