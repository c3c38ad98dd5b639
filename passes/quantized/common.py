"""What the quantized rewrites share: a function's bindings to read chains off, constant scalars,
float32 arithmetic rounded as onnxruntime rounds it, and the uint8 rounding every form ends in."""

from __future__ import annotations

import collections
from typing import Protocol

import numpy as np
from tvm import relax

from relaxc.passes.ir import constant_array

# sums of integers below this are exact in float32: a depthwise convolution's few uint8 x int8
# products (at most 255 x 128 each) are summed in float, one FMA a tap, where int32 lanes take a
# two-uop multiply and an add (MobileNetV2 int8 ran 1.73x slower so), and the sum stays in float
FLOAT_EXACT = 1 << 24


class Rewriter(Protocol):
    """The mutator that rewrites a function's chains, as the builders of each form use it."""

    builder_: relax.BlockBuilder
    saturated_pairs: bool  # the target's byte dot saturates pairs of products (vpmaddubsw)
    exact: bool  # every sum exact (int8 activations held as uint8)

    def visit_expr(self, expr: relax.Expr) -> relax.Expr: ...


def scalar(expr: relax.Expr) -> float | None:
    """The value of a constant of one element; None for anything else."""
    array = constant_array(expr)
    if array is None or array.size != 1:
        return None
    return array.reshape(()).item()


def fma(a: np.ndarray | np.float32, b: np.ndarray | np.float32, c: np.ndarray | np.float32) -> np.ndarray:
    """float32 ``a * b + c`` rounded once (the product is exact in float64)."""
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(np.float32)


def rounded(value: relax.Expr, zero: int) -> relax.Expr:
    """``saturate_uint8(round_half_even(value) + zero)`` as TVM's quantize at scale 1 computes it
    (Relax's own ``round`` becomes a ``nearbyint`` that made MobileNetV2's int8 kernels up to 5x as
    slow)."""
    return relax.op.quantize(value, relax.const(np.float32(1.0)), relax.const(np.uint8(zero)), axis=-1,
                             out_dtype="uint8")


@relax.expr_functor.visitor
class _Collector(relax.PyExprVisitor):
    """Every variable's bound value, and how many times each is used."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[relax.Var, relax.Expr] = {}
        self.uses: collections.Counter = collections.Counter()

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        self.values[binding.var] = binding.value
        self.visit_expr(binding.value)

    def visit_var_(self, var: relax.Var) -> None:
        self.uses[var] += 1

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> None:
        self.uses[var] += 1


class Bindings:
    """A function's variables with their bound values and use counts, which the matchers of each
    form follow from a ``quantize`` back to the ``dequantize``s it computes from."""

    def __init__(self, func: relax.Function) -> None:
        collector = _Collector()
        collector.visit_expr(func)
        self.values: dict[relax.Var, relax.Expr] = collector.values
        self.uses: collections.Counter = collector.uses

    def value(self, expr: relax.Expr) -> relax.Expr:
        """The value bound to ``expr`` where it is a bound variable, else ``expr``."""
        return self.values.get(expr, expr) if isinstance(expr, relax.Var) else expr

    def single(self, expr: relax.Expr) -> tuple[relax.Var, relax.Expr] | None:
        """A variable used once (a chain may own it) and its value."""
        if isinstance(expr, relax.Var) and self.uses[expr] == 1 and expr in self.values:
            return expr, self.values[expr]
        return None
