"""Rewrite importer idioms into the plain operators later passes understand.

TVM's ONNX importer turns ``Sum(a, b, ...)`` (ResNet-50's residual additions, ShuffleNet's) into
``sum(stack(broadcast_to(a, S), broadcast_to(b, S)), axis=0)``. That is an n-ary add, but
``stack`` and a reduction over the new axis hide it: the layout pass must treat them as
layout-sensitive, and they cost a copy of every operand. Here they become a chain of ``add``.
"""

from __future__ import annotations

import tvm
from tvm import relax


def _shape(expr: relax.Expr) -> tuple | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return tuple(int(d) for d in ty.shape.values if isinstance(d, tvm.tirx.IntImm))


@relax.expr_functor.mutator
class _SumOfStack(relax.PyExprMutator):
    def _bound(self, expr: relax.Expr) -> relax.Expr:
        bound = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        return bound if bound is not None else expr

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.sum") or call.attrs.keepdims \
                or call.attrs.axis is None or [int(a) for a in call.attrs.axis] != [0]:
            return call
        stacked = self._bound(call.args[0])
        if not (isinstance(stacked, relax.Call) and isinstance(stacked.op, tvm.ir.Op)
                and stacked.op.name == "relax.stack" and int(stacked.attrs.axis) == 0):
            return call
        parts = self._bound(stacked.args[0])
        if not isinstance(parts, relax.Tuple) or len(parts.fields) < 2:
            return call
        target = _shape(call)
        operands = []
        for part in parts.fields:
            bound = self._bound(part)
            is_noop_broadcast = isinstance(bound, relax.Call) and isinstance(bound.op, tvm.ir.Op) \
                and bound.op.name == "relax.broadcast_to" and _shape(bound.args[0]) == target
            operands.append(bound.args[0] if is_noop_broadcast else part)
        total = operands[0]
        for operand in operands[1:]:
            total = self.builder_.normalize(relax.op.add(total, operand))
        return total


@tvm.transform.module_pass(opt_level=0, name="relaxc.SumOfStackToAdd")
class SumOfStackToAdd:
    """``sum(stack((a, b, ...)), axis=0)`` to ``a + b + ...`` (no-op broadcasts dropped)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                mod[gvar] = _SumOfStack(mod).visit_expr(func)
        return mod
