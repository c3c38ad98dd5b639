"""Concatenations without their empty operands.

Exporters write a partial rotary embedding as ``concat(rotate(x[..., :r]), x[..., r:])`` whether or not
``r`` is the whole head (Phi-3 rotates every dim): the pass-through slice is then empty, and a kernel
fused around a zero-extent loop broke the tiled schedule (a division by its extent). An operand whose
extent along the concatenation's axis is 0 adds nothing: it is dropped, and a concatenation of one
operand is that operand.
"""

from __future__ import annotations

import tvm
from tvm import relax

from relaxc.passes.ir import dims_of, is_op, MutatorPass


@relax.expr_functor.mutator
class _EmptyOperands(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        dims = dims_of(call)
        if not is_op(call, "relax.concat") or not isinstance(call.args[0], relax.Tuple) or dims is None:
            return call
        axis = int(call.attrs.axis) % len(dims)
        parts = call.args[0].fields
        kept = [part for part in parts if (dims_of(part) or (None,) * len(dims))[axis] != 0]
        if len(kept) == len(parts) or not kept:
            return call
        return kept[0] if len(kept) == 1 else relax.op.concat(kept, axis)


@tvm.transform.module_pass(opt_level=0, name="relaxc.EmptyConcatOperands")
class EmptyConcatOperands(MutatorPass):
    """``concat`` without its operands of extent 0 along its axis."""

    mutator = _EmptyOperands
