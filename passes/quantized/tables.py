"""Quantized pointwise arithmetic on one uint8 tensor (a sigmoid, a SiLU's product) as a table of
its 256 values, computed while compiling and looked up at run time, as onnxruntime's
``QLinearSigmoid`` is (its ``QLinearMul`` of ``x`` and ``sigmoid(x)`` one too)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tvm
from tvm import relax

from relaxc.passes.ir import constant_array, is_op
from relaxc.passes.quantized.common import Bindings, Rewriter, fma, scalar


@dataclass
class Table:
    """A uint8 ``quantize`` of pointwise arithmetic on one uint8 tensor: one of 256 values for each
    of its values; the tensor becomes a lookup."""

    data: relax.Expr
    values: np.ndarray  # int32, by the data's value


# MLAS's logistic (Eigen's rational approximation), which onnxruntime's Sigmoid and its
# QLinearSigmoid tables compute on x86-64 CPUs (its FMA3 kernel): p(x^2) x / q(x^2) + 1/2
_LOGISTIC_P = np.float32([4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03,
                          2.48287947061529e-01])
_LOGISTIC_Q = np.float32([6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06, 1.70198817374094e-03,
                          1.16817656904453e-01, 9.93151921023180e-01])


def _logistic(values: np.ndarray) -> np.ndarray:
    """The sigmoid as MLAS's FMA3 kernel computes it, operation by operation: a float64 sigmoid
    rounded to float32 put 1.4 % of a quantized sigmoid's outputs one step from onnxruntime's."""
    x = np.clip(values.astype(np.float32), np.float32(-18), np.float32(18))
    square = x * x
    p, q = fma(square, _LOGISTIC_P[0], _LOGISTIC_P[1]), fma(square, _LOGISTIC_Q[0], _LOGISTIC_Q[1])
    for coefficient in _LOGISTIC_P[2:]:
        p = fma(square, p, coefficient)
    for coefficient in _LOGISTIC_Q[2:]:
        q = fma(square, q, coefficient)
    return np.maximum((x * p) / q + np.float32(0.5), np.float32(0))


POINTWISE: dict[str, Callable[..., np.ndarray]] = {
    "relax.sigmoid": _logistic,
    "relax.tanh": lambda v: np.tanh(v.astype(np.float64)).astype(np.float32),
    "relax.erf": lambda v: np.vectorize(math.erf, otypes=[np.float64])(v.astype(np.float64)).astype(np.float32),
    "relax.nn.relu": lambda v: np.maximum(v, np.float32(0)),
    "relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
    "relax.divide": np.divide, "relax.maximum": np.maximum, "relax.minimum": np.minimum,
}
_VALUES = np.arange(256, dtype=np.uint8)


class _NotPointwise(Exception):
    """An expression that is not pointwise arithmetic on one uint8 tensor."""


class _Evaluation:
    """One expression evaluated at each of the 256 values of its uint8 sources, read through the
    forms found before it."""

    def __init__(self, bindings: Bindings, forms: dict[relax.Var, tuple[relax.Expr, np.ndarray]]) -> None:
        self.bindings = bindings
        self.forms = forms
        self.sources: list[relax.Expr] = []

    def evaluated(self, expr: relax.Expr) -> np.ndarray:
        """``expr`` at each of the 256 values of its one uint8 source (appended to ``sources``),
        float32 as the QDQ graph defines it, a uint8 quantize's product of two dequantized values as
        onnxruntime's ``QLinearMul``; ``_NotPointwise`` where it is not such an expression."""
        value = self.bindings.value(expr)
        if constant_array(value) is not None:
            if scalar(value) is None:
                raise _NotPointwise  # per channel: one table would not do
            return np.float32(scalar(value))
        if is_op(value, "relax.dequantize"):
            data, scale, zero = value.args[0], scalar(value.args[1]), scalar(value.args[2])
            if None in (scale, zero) or str(data.ty.dtype) != "uint8":
                raise _NotPointwise
            centred = self._integers(data).astype(np.int32) - np.int32(zero)
            return centred.astype(np.float32) * np.float32(scale)
        if is_op(value, "relax.quantize") and str(value.attrs.out_dtype) == "uint8":
            inner, scale, zero = value.args[0], scalar(value.args[1]), scalar(value.args[2])
            if None in (scale, zero):
                raise _NotPointwise
            product = self.bindings.value(inner)
            if is_op(product, "relax.multiply") and all(is_op(self.bindings.value(a), "relax.dequantize")
                                                         for a in product.args):
                return self._multiplied(product, np.float32(scale), zero)
            quantized = np.rint(self.evaluated(inner) / np.float32(scale)) + zero
            return np.clip(quantized, 0, 255).astype(np.uint8)
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in POINTWISE:
            return POINTWISE[value.op.name](*(self.evaluated(a) for a in value.args)).astype(np.float32)
        if is_op(value, "relax.clip"):
            low, high = (float(v.value) for v in value.args[1:])
            return np.clip(self.evaluated(value.args[0]), np.float32(low), np.float32(high))
        raise _NotPointwise

    def _integers(self, data: relax.Expr) -> np.ndarray:
        """The uint8 values of ``data`` at each value of the source: a quantize of pointwise
        arithmetic on one tensor by its form, anything else the source itself."""
        source, values = self.forms.get(data, (data, _VALUES))
        if not any(source.same_as(known) for known in self.sources):
            self.sources.append(source)
        return values

    def _multiplied(self, product: relax.Call, y_scale: np.float32, y_zero: float) -> np.ndarray:
        """MLAS's ``QLinearMul``: ``round((a - za) (b - zb) * (sa sb / sy) + zy)``, saturated."""
        (a, sa, za), (b, sb, zb) = (self.bindings.value(arg).args for arg in product.args)
        if None in (scalar(sa), scalar(za), scalar(sb), scalar(zb)) or str(a.ty.dtype) != "uint8" \
                or str(b.ty.dtype) != "uint8":
            raise _NotPointwise
        centred = [self._integers(x).astype(np.int32) - np.int32(scalar(z)) for x, z in ((a, za), (b, zb))]
        ratio = np.float32(np.float32(scalar(sa)) * np.float32(scalar(sb)) / y_scale)
        products = (centred[0] * centred[1]).astype(np.float32)
        return np.clip(np.rint(products * ratio + np.float32(y_zero)), 0, 255).astype(np.uint8)


def read_form(bindings: Bindings, forms: dict[relax.Var, tuple[relax.Expr, np.ndarray]],
              call: relax.Call) -> tuple[relax.Expr, np.ndarray] | None:
    """(its one uint8 source, its value at each of the source's 256 values) of a quantize of
    pointwise arithmetic on one uint8 tensor; None for any other. ``forms``: those of the quantizes
    before it, read instead of evaluated again."""
    evaluation = _Evaluation(bindings, forms)
    try:
        values = evaluation.evaluated(call)
    except _NotPointwise:
        return None
    return (evaluation.sources[0], values) if len(evaluation.sources) == 1 else None


def read_table(bindings: Bindings, call: relax.Call, form: tuple[relax.Expr, np.ndarray] | None) -> Table | None:
    """The table of a quantize of a pointwise operator's result, ``form`` its values (None: it has
    no table); None for a quantize of anything else."""
    if form is None or not any(is_op(bindings.value(call.args[0]), op) for op in POINTWISE):
        return None
    return Table(form[0], form[1].astype(np.int32))


def looked_up(rewriter: Rewriter, chain: Table) -> relax.Expr:
    """The uint8 values of ``chain`` looked up by its tensor's values."""
    indices = rewriter.builder_.normalize(relax.op.astype(rewriter.visit_expr(chain.data), "int32"))
    values = rewriter.builder_.normalize(relax.op.take(relax.const(chain.values), indices, axis=0,
                                                       mode="clip"))  # in range: no index check
    return relax.op.astype(values, "uint8")
