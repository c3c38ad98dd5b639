"""A decoder's one-token step as a program of its own (a pass of the layout phase, for a decoder
compiled with ``max_length``).

Generation runs the prompt once, then one token per step: ``main`` (any sequence length) serves
the prompt, and ``decode``, ``main`` with the sequence length bound to 1, each step. Its kernels
are built for one query, so attention pads no query rows to whole register tiles
(``passes/attention.py``): with 1,024 tokens cached, GPT-2 small's attention kernels computed 8
rows for the 1 each step needs. The two functions share every weight (the same constants).
``main`` computes the logits of its last position alone (``LastPositionLogits``): what a prompt's
step returns.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.utils import copy_with_new_vars

from relaxc.passes.ir import constant_array, is_op, rewrite_emitting


@tvm.transform.module_pass(opt_level=0, name="relaxc.DecodeStep")
class DecodeStep:
    """Add ``decode``: ``main`` with its dynamic dim ``sequence`` (a name) bound to 1."""

    def __init__(self, sequence: str) -> None:
        self.sequence = sequence

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        main = mod["main"]
        bound = copy_with_new_vars(main).bind_symbolic_vars({self.sequence: 1})  # variables of its own
        upper = {name: value for name, value in (main.attrs.get("tir_var_upper_bound") or {}).items()
                 if name != self.sequence}
        mod = mod.clone()
        mod["decode"] = bound.with_attrs({"global_symbol": "decode", "tir_var_upper_bound": upper})
        return mod


@relax.expr_functor.mutator
class _LastPosition(relax.PyExprMutator):
    def visit_function_(self, func: relax.Function) -> relax.Expr:
        if (func.attrs or {}).get("global_symbol") != "main":
            return func
        self.bound = {b.var: b.value for block in func.body.blocks for b in block.bindings}
        outputs = self.bound.get(func.body.body)
        self.logits = outputs.fields[0] if isinstance(outputs, relax.Tuple) else None
        self.sliced = False
        body = self.visit_expr(func.body)
        if not self.sliced:
            return func
        return relax.Function(func.params, body, body.ty, func.is_pure, func.attrs)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        if not binding.var.same_as(self.logits) or not is_op(value, "relax.matmul") \
                or constant_array(value.args[1]) is None or len(value.args[0].ty.shape.values) != 3:
            return super().visit_var_binding_(binding)
        rows = self.visit_expr(value.args[0])
        length = rows.ty.shape.values[1]
        last = self.builder_.emit(relax.op.strided_slice(rows, [1], [length - 1], [length], assume_inbound=True))
        self.sliced = True
        product = relax.op.matmul(last, value.args[1], out_dtype=value.attrs.out_dtype)
        self.set_var_remap(binding.var, self.builder_.emit(product, name_hint=binding.var.name))


@tvm.transform.module_pass(opt_level=0, name="relaxc.LastPositionLogits")
class LastPositionLogits:
    """``main``'s logits for the last position alone, where a product by constant weights (the
    language model head) makes them: a prompt's step needs no other (GPT-2 small's head is 39 G
    multiply-adds for 1,024 positions, 39 M for one)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_emitting(mod, _LastPosition(mod.clone()))
