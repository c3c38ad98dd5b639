"""Integer matmuls (ONNX ``MatMulInteger``, what ``quantize_dynamic`` emits) on uint8 x int8 bytes.

TVM imports ``MatMulInteger(xq, wq, zx, zw)`` as a matmul of int32 operands, ``(xq - zx) @ (wq -
zw)``, every byte widened to four. With constant weights the folded ``wq - zw`` fits int8 whenever
the weights are symmetric int8 (``zw = 0``, the quantizer's default) or uint8 around 128, so

    (xq - zx) @ W = xq @ W - zx * colsum(W)

keeps the data uint8 and the weights int8: a product ``vpdpbusd`` multiplies 64 of at a time
(``passes/dense.py`` packs the weights, ``schedules/cpu/dense.py`` tiles it), the zero point one
int32 vector subtracted in the epilogue. The sums are onnxruntime's: exact with VNNI, and without
it the pairs of products saturated to int16 as its kernels saturate them (``support/targets.py``).
Products of other forms stay int32, counted in ``summary()`` (``report()["integer_matmuls"]``) by why.
"""

from __future__ import annotations

import collections

import numpy as np
import tvm
from tvm import relax

from relaxc.passes.ir import constant, constant_array, is_op, rewrite_emitting

INT8 = (-128, 127)


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, stats: dict) -> None:
        super().__init__(mod)
        self.stats = stats

    def _value(self, expr: relax.Expr) -> relax.Expr:
        value = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        return expr if value is None else value

    def _widened(self, expr: relax.Expr) -> relax.Expr | None:
        """The 8-bit tensor ``expr`` is an int32 copy of, if it is one."""
        value = self._value(expr)
        if is_op(value, "relax.astype") and value.args[0].ty.dtype in ("uint8", "int8"):
            return value.args[0]
        array = constant_array(value)
        if array is not None and array.size == 1 and 0 <= array.min() <= 255:
            return relax.const(np.uint8(array.reshape(())))
        return None

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not is_op(call, "relax.matmul") or call.ty.dtype != "int32":
            return call
        lhs, rhs = call.args
        if lhs.ty.dtype in ("uint8", "int8"):  # bytes already (passes/quantized/products.py's)
            return call
        weights = constant_array(rhs)
        shifted = is_op(self._value(lhs), "relax.subtract")
        data, zero = (self._widened(arg) for arg in self._value(lhs).args) if shifted else (self._widened(lhs), None)
        why = None
        if data is None or (shifted and zero is None):
            why = "data not an 8-bit tensor minus its zero point"
        elif data.ty.dtype != "uint8" or (zero is not None and (zero.ty.ndim != 0 or zero.ty.dtype != "uint8")):
            why = "int8 data"
        elif weights is None or weights.ndim != 2:
            why = "weights not a constant matrix"
        elif weights.min(initial=0) < INT8[0] or weights.max(initial=0) > INT8[1]:
            why = "weights minus their zero point outside int8"
        if why is not None:
            self.stats["int32"][why] += 1
            return call
        self.stats["matmuls"] += 1
        product = relax.op.matmul(data, constant(weights.astype(np.int8)), out_dtype="int32")
        if zero is None:
            return product
        columns = constant(weights.astype(np.int32).sum(axis=0, dtype=np.int32))
        offset = self.builder_.normalize(relax.op.multiply(
            self.builder_.normalize(relax.op.astype(zero, "int32")), columns))
        return relax.op.subtract(self.builder_.normalize(product), offset)


@tvm.transform.module_pass(opt_level=0, name="relaxc.IntegerMatmuls")
class IntegerMatmuls:
    """Int32 matmuls of widened uint8 data and constant int8-range weights as uint8 x int8 products.

    ``summary()`` (``report()["integer_matmuls"]``): ``matmuls`` rewritten, ``int32`` the integer
    matmuls left widened, counted by why."""

    report_key = "integer_matmuls"

    def __init__(self) -> None:
        self.stats = {"matmuls": 0, "int32": collections.Counter()}

    def summary(self) -> dict:
        return {"matmuls": self.stats["matmuls"], "int32": dict(self.stats["int32"])}

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.stats = {"matmuls": 0, "int32": collections.Counter()}
        return relax.transform.DeadCodeElimination()(rewrite_emitting(mod, _Rewriter(mod.clone(), self.stats)))
