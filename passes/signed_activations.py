"""Int8 (signed) quantized activations held as uint8 ones, 128 higher.

onnxruntime's quantizer writes int8 activations by default (``activation_type=QInt8``), but the
byte dot products (``vpdpbusd``, ``vpmaddubsw``) take unsigned data, and
``passes/quantized/`` reads uint8 chains. The same arithmetic holds on every activation plus 128:

    DequantizeLinear(xq, s, z)  = DequantizeLinear(xq + 128 as uint8, s, z + 128)
    QuantizeLinear(v, s, z) + 128 = QuantizeLinear(v, s, z + 128) to uint8

(the clamp to [-128, 127] shifted is the clamp to [0, 255]), so each int8 ``quantize`` of a
non-constant tensor writes the uint8 form and each ``dequantize`` of one reads it: the int8 value
is made (its sign bit flipped back) only where something else reads it, a model output or an op
on the integers themselves, and dead code goes. Constant int8 tensors (the weights) stay as they are.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from relaxc.passes.ir import constant_array, is_op, rewrite_emitting

SIGN = 128  # an int8 value plus this is the uint8 of the same bits but the sign's
SIGNED_ATTR = "relaxc.signed_activations"  # on a module whose int8 activations are held as uint8


def _flipped(expr: relax.Expr, dtype: str) -> relax.Call:
    """``expr``'s bits with the sign bit flipped, as ``dtype`` (uint8 <-> int8: plus or minus 128)."""
    if dtype == "uint8":
        return relax.op.bitwise_xor(relax.op.astype(expr, "uint8"), relax.const(np.uint8(SIGN)))
    return relax.op.astype(relax.op.bitwise_xor(expr, relax.const(np.uint8(SIGN))), "int8")


@relax.expr_functor.mutator
class _Unsigned(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.rewritten = 0

    def _unsigned(self, expr: relax.Expr) -> relax.Expr:
        """The uint8 form of the int8 tensor ``expr``: the one it was made from, where it was."""
        value = self._bound(expr)
        flipped = self._bound(value.args[0]) if is_op(value, "relax.astype") else None
        if is_op(flipped, "relax.bitwise_xor") and str(flipped.args[0].ty.dtype) == "uint8":
            return flipped.args[0]  # int8 made from a uint8 form (here)
        return self.builder_.normalize(_flipped(expr, "uint8"))

    def _bound(self, expr: relax.Expr) -> relax.Expr:
        value = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        return expr if value is None else value

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if is_op(call, "relax.quantize") and str(call.attrs.out_dtype) == "int8":
            zero = constant_array(call.args[2])
            if zero is None:
                return call
            unsigned = relax.op.quantize(call.args[0], call.args[1], _shifted(zero), int(call.attrs.axis), "uint8")
            self.rewritten += 1
            return _flipped(self.builder_.normalize(unsigned), "int8")
        if is_op(call, "relax.dequantize") and str(call.args[0].ty.dtype) == "int8" \
                and constant_array(call.args[0]) is None:
            zero = constant_array(call.args[2])
            if zero is None:
                return call
            return relax.op.dequantize(self._unsigned(call.args[0]), call.args[1], _shifted(zero),
                                       int(call.attrs.axis), str(call.attrs.out_dtype))
        return call


def _shifted(zero: np.ndarray) -> relax.Constant:
    return relax.const((zero.astype(np.int16) + SIGN).astype(np.uint8))


@tvm.transform.module_pass(opt_level=0, name="relaxc.SignedActivationsAsUnsigned")
class SignedActivationsAsUnsigned:
    """Int8 activations held as uint8 ones 128 higher, so quantized chains on them run on the
    byte products as uint8 ones do.

    The module is marked ``SIGNED_ATTR`` where any were: 128 higher, their products' pairs would
    saturate (``vpmaddubsw``, no VNNI) where onnxruntime's int8 kernels sum exactly, so
    ``passes/quantized/products.py`` then sums exactly.

    ``summary()`` (``report()["signed_activations"]``): ``quantizes``, the int8 quantizes so rewritten."""

    report_key = "signed_activations"

    def __init__(self) -> None:
        self.rewritten = 0

    def summary(self) -> dict:
        return {"quantizes": self.rewritten}

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        rewriter = _Unsigned(mod.clone())
        mod = relax.transform.DeadCodeElimination()(rewrite_emitting(mod, rewriter))
        self.rewritten = rewriter.rewritten
        return mod.with_attr(SIGNED_ATTR, True) if self.rewritten else mod
