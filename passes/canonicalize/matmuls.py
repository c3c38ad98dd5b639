"""Matmuls of rows flattened from dynamic dims, computed on the unflattened rows.

A matmul by constant weights of rows flattened from dynamic leading dims and reshaped back
(``x.view(-1, K)`` then a Linear's ``addmm`` and ``view``: GPT-2's Conv1D) becomes the matmul of
the unflattened rows: the reshapes of a dynamic size fuse with nothing, so the bias, GELU and
residual add after each ran as kernels of their own (GPT-2 at 16 tokens: 1.23x its static build).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.ir import GenericConst
from tvm.sym.analyzer import Analyzer

from relaxc.passes.ir import dims_of, is_op, MutatorPass, static_shape


def _same_dims(a: list, b: list) -> bool:
    analyzer = Analyzer()
    return len(a) == len(b) and all(analyzer.can_prove_equal(x, y) for x, y in zip(a, b))


@relax.expr_functor.mutator
class _FlattenedMatmul(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        target = dims_of(call)
        if not is_op(call, "relax.reshape") or target is None or static_shape(call) is not None:
            return call
        value = self.lookup_binding(call.args[0]) if isinstance(call.args[0], relax.Var) else None
        bias = None
        if is_op(value, "relax.add") and isinstance(value.args[1], GenericConst) \
                and len(value.args[1].ty.shape.values) <= 2:  # a bias, (N,) or (1, N)
            bias, value = value.args[1], (self.lookup_binding(value.args[0]) if isinstance(value.args[0], relax.Var)
                                          else None)
        if not is_op(value, "relax.matmul") or not isinstance(value.args[1], GenericConst) \
                or len(value.args[1].ty.shape.values) != 2 or not isinstance(value.args[0], relax.Var):
            return call
        flatten = self.lookup_binding(value.args[0])
        rows = dims_of(flatten) if is_op(flatten, "relax.reshape") else None
        if rows is None or len(rows) != 2 or not _same_dims([rows[0]], [math.prod(target[:-1])]):
            return call  # not the rows of the leading dims the reshape restores
        x = flatten.args[0]
        if not _same_dims(dims_of(x), [*target[:-1], rows[1]]):  # (b, s, heads, d) flattened to (b s, heads d)
            x = self.builder_.emit(relax.op.reshape(x, [*target[:-1], rows[1]]))
        product = relax.op.matmul(x, value.args[1], out_dtype=value.attrs.out_dtype)
        return relax.op.add(self.builder_.emit(product), bias) if bias is not None else product


@tvm.transform.module_pass(opt_level=0, name="relaxc.MatmulOfFlattenedRows")
class MatmulOfFlattenedRows(MutatorPass):
    """``reshape(matmul(reshape(x, (rows, K)), W) [+ b], dims + (N,))`` to ``matmul(x, W) [+ b]``
    (x viewed as ``dims + (K,)``) where the dims are dynamic."""

    mutator = _FlattenedMatmul
