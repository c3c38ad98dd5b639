"""Importer idioms of elementwise operators (``Sum``, ``Dropout``, a division by a constant, ``Clip``
lowered to TIR) as the plain operators later passes understand.

TVM's ONNX importer turns ``Sum(a, b, ...)`` (ResNet-50's residual additions, ShuffleNet's) into
``sum(stack(broadcast_to(a, S), broadcast_to(b, S)), axis=0)``. That is an n-ary add, but
``stack`` and a reduction over the new axis hide it: the layout pass must treat them as
layout-sensitive, and they cost a copy of every operand. Here they become a chain of ``add``.

``Dropout`` is the identity at inference, and TVM legalises it so, as a copy plus a mask of ones;
its output is replaced by its input (the mask, if anything reads it, is left to TVM).

Division by a constant becomes multiplication by its reciprocal: a vector division costs about
ten FMAs (hard-swish's ``/ 6``, in every MobileNetV3 block, made 21 ``vdivps`` in one conv's
epilogue; GELU's ``/ sqrt(2)``). Exact for powers of two, otherwise within an ulp of the division
(ONNX's own HardSigmoid and HardSwish are defined with the multiplication by 1/6); constants whose
reciprocal is not a normal float, and half types (where an ulp is 2^-11 or 2^-8), keep the division.

The importer also lowers ``Clip`` straight to TIR (``call_tir`` of TOPI's maximum and minimum against a
scalar bound), which no Relax pass can see through; those calls become ``R.maximum`` and
``R.minimum`` again, so ReLU6 and friends stay in the blocked layout.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, s_tir, tirx
from tvm.ir.expr import TensorLoad

from relaxc.passes.ir import constant_array, is_op, MutatorPass, map_relax_functions, static_shape


@relax.expr_functor.mutator
class _SumOfStack(relax.PyExprMutator):
    def _bound(self, expr: relax.Expr) -> relax.Expr:
        bound = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        return bound if bound is not None else expr

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not is_op(call, "relax.sum") or call.attrs.keepdims \
                or call.attrs.axis is None or [int(a) for a in call.attrs.axis] != [0]:
            return call
        stacked = self._bound(call.args[0])
        if not (is_op(stacked, "relax.stack") and int(stacked.attrs.axis) == 0):
            return call
        parts = self._bound(stacked.args[0])
        if not isinstance(parts, relax.Tuple) or len(parts.fields) < 2:
            return call
        target = static_shape(call)
        operands = []
        for part in parts.fields:
            bound = self._bound(part)
            is_noop_broadcast = target is not None and is_op(bound, "relax.broadcast_to") \
                and static_shape(bound.args[0]) == target
            operands.append(bound.args[0] if is_noop_broadcast else part)
        total = operands[0]
        for operand in operands[1:]:
            total = self.builder_.normalize(relax.op.add(total, operand))
        return total


@relax.expr_functor.mutator
class _DropoutOutput(relax.PyExprMutator):
    def visit_tuple_getitem_(self, item: relax.TupleGetItem) -> relax.Expr:
        item = self.visit_expr_post_order(item)
        source = self.lookup_binding(item.tuple_value) if isinstance(item.tuple_value, relax.Var) else None
        if item.index == 0 and is_op(source, "relax.nn.dropout"):
            return source.args[0]
        return item


@tvm.transform.module_pass(opt_level=0, name="relaxc.SumOfStackToAdd")
class SumOfStackToAdd(MutatorPass):
    """``sum(stack((a, b, ...)), axis=0)`` to ``a + b + ...`` (no-op broadcasts dropped)."""

    mutator = _SumOfStack


@tvm.transform.module_pass(opt_level=0, name="relaxc.DropoutToIdentity")
class DropoutToIdentity(MutatorPass):
    """The output of an inference-time dropout is its input."""

    mutator = _DropoutOutput


@relax.expr_functor.mutator
class _DivideByConstant(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        divisor = constant_array(call.args[1]) if is_op(call, "relax.divide") else None
        if divisor is None or divisor.dtype not in (np.float32, np.float64):
            return call  # a half type's reciprocal is off by up to 2^-11 (bfloat16: 2^-8)
        if is_op(self.lookup_binding(call.args[0]) if isinstance(call.args[0], relax.Var) else None,
                 "relax.nn.avg_pool2d"):
            return call  # quantizing an average (passes/quantized/pooling.py): rounds the quotient onnxruntime rounds
        with np.errstate(all="ignore"):
            reciprocal = (1 / divisor).astype(divisor.dtype)
        if not (np.abs(reciprocal) >= np.finfo(divisor.dtype).tiny).all() or not np.isfinite(reciprocal).all():
            return call
        return relax.op.multiply(call.args[0], relax.const(reciprocal, str(divisor.dtype)))


def _max_or_min_with_scalar(func: tirx.PrimFunc) -> str | None:
    """``"relax.maximum"``/``"relax.minimum"`` if ``func`` is out[i] = max/min(a[i], b[]), else None."""
    if len(func.params) != 3:
        return None
    sch = s_tir.Schedule(func)
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except (s_tir.ScheduleError, ValueError):
        return None
    store = sch.get(blocks[0]).body if len(blocks) == 1 else None
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, (tirx.Max, tirx.Min)):
        return None
    lhs, rhs = store.value.a, store.value.b
    data, bound, out = func.params
    if not (isinstance(lhs, TensorLoad) and isinstance(rhs, TensorLoad)
            and lhs.source.same_as(data) and rhs.source.same_as(bound) and store.buffer.same_as(out)
            and len(rhs.indices) == 0 and len(lhs.indices) == len(store.indices)
            and all(a.same_as(b) for a, b in zip(lhs.indices, store.indices))):
        return None
    return "relax.maximum" if isinstance(store.value, tirx.Max) else "relax.minimum"


@relax.expr_functor.mutator
class _CallTIRToOp(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.ops = {gvar: op for gvar, func in mod.functions_items()
                    if isinstance(func, tirx.PrimFunc) and (op := _max_or_min_with_scalar(func))}

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not is_op(call, "relax.call_tir") \
                or call.args[0] not in self.ops or not isinstance(call.args[1], relax.Tuple):
            return call
        data, bound = call.args[1].fields
        return relax.Call(tvm.ir.Op.get(self.ops[call.args[0]]), [data, bound])


@tvm.transform.module_pass(opt_level=0, name="relaxc.DivideByConstantToMultiply")
class DivideByConstantToMultiply(MutatorPass):
    """``x / c`` for a float constant c to ``x * (1 / c)`` where 1 / c is a normal float."""

    mutator = _DivideByConstant


@tvm.transform.module_pass(opt_level=0, name="relaxc.ClipFromTIR")
class ClipFromTIR:
    """``call_tir`` of an elementwise max/min against a scalar back to ``R.maximum``/``R.minimum``."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        rewriter = _CallTIRToOp(mod)
        if not rewriter.ops:
            return mod
        return relax.transform.DeadCodeElimination()(map_relax_functions(mod, rewriter.visit_expr))
