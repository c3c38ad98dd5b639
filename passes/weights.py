"""A decoder's weights as an argument of its programs, not constants inside the library (a pass of
the lower phase, for a decoder compiled with ``max_length``).

Constants built into a library are copied out of it when it loads: GPT-2 small's 655 MB of weights
took 1.25 GB more resident memory after loading, and 2.5 GB at the peak. Here every weight the
finished ``main`` and ``decode`` read (after packing and folding, so what the kernels read) becomes
an element of one tuple parameter, ``weights``, that both take last; the export writes them to a
file beside the library, which loading maps into memory (``compiler/weights.py``).
"""

from __future__ import annotations

import tvm
from tvm import relax

from relaxc.passes.ir import constant_array

FUNCTIONS = ("main", "decode")  # a decoder's programs (passes/decode.py)
SMALLEST = 1024  # bytes: smaller constants (shapes, scalars) stay in the program


@relax.expr_functor.visitor
class _Collect(relax.PyExprVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.found: dict[object, int] = {}  # each weight once, in the order first read

    def visit_generic_const_(self, const: relax.Expr) -> None:
        array = constant_array(const)
        if array is not None and array.nbytes >= SMALLEST and const not in self.found:
            self.found[const] = len(self.found)


@relax.expr_functor.mutator
class _Lift(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, found: dict[object, int], ty: relax.TupleType) -> None:
        super().__init__(mod)
        self.found, self.ty = found, ty

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        self.param = relax.Var("weights", self.ty)
        body = self.visit_expr(func.body)
        attrs = dict(func.attrs) | {"num_input": len(func.params)}  # the weights are no input to check
        return relax.Function([*func.params, self.param], body, func.ret_ty, func.is_pure,
                              tvm.ir.make_node("ir.DictAttrs", **attrs))

    def visit_generic_const_(self, const: relax.Expr) -> relax.Expr:
        index = self.found.get(const)
        return const if index is None else relax.TupleGetItem(self.param, index)


@tvm.transform.module_pass(opt_level=0, name="relaxc.LiftWeights")
class LiftWeights:
    """``main``'s and ``decode``'s weights (constants of ``SMALLEST`` bytes or more) as their last
    parameter, a tuple; ``weights`` holds their values (the constants' own tensors), in its order,
    once the pass ran."""

    def __init__(self) -> None:
        self.weights: list[tvm.runtime.Tensor] = []

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        collect = _Collect()
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function) and gvar.name_hint in FUNCTIONS:
                collect.visit_expr(func)
        if not collect.found:
            return mod
        constants = list(collect.found)
        self.weights = [c.value for c in constants]
        ty = relax.TupleType([c.ty for c in constants])
        lift = _Lift(mod.clone(), collect.found, ty)
        new = mod.clone()
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function) and gvar.name_hint in FUNCTIONS:
                new[gvar] = lift.visit_expr(func)
        return new
