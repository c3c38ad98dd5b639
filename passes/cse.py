"""Common subexpression elimination that does not read the weights.

TVM's ``EliminateCommonSubexpr`` keys every binding by its structural hash, and a structural hash
reads each constant's bytes, twice per binding (a lookup, then an insert): 0.6 s of a VGG-19
compile for its 575 MB of weights, about 1 ms per MB. Where the weights are large, each large
constant here becomes a parameter of its function first (one per constant object), TVM's pass runs
on that, and the parameters are bound back to the same constants. Lifting and binding back rebuild
the function, about 1.4 ms per constant (DenseNet-121: 109 constants of 32 MB in all, 0.15 s
against TVM's 0.05 s), so a function whose large constants average under ``LIFT_MB`` goes to TVM's
pass as it is. Small constants (scalars, shapes, biases) are never lifted, so equal ones still
merge by value; two large constants with equal bytes that are distinct objects are no longer merged
once lifted (a model that holds the same weights twice computes with both copies).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir import GenericConst

from relaxc.passes.ir import map_relax_functions

LIFTED_BYTES = 4096  # constants this large may become parameters; hashing smaller ones costs little
LIFT_MB = 1.5  # lift when the large constants average this many MB: hashing them then costs more


def _nbytes(const: GenericConst) -> int:
    value = const.value
    return int(np.prod(value.shape)) * tvm.runtime.DataType(value.dtype).itemsize


@relax.expr_functor.visitor
class _LargeConstants(relax.PyExprVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.found: dict[int, int] = {}  # bytes, by the constant object

    def visit_generic_const_(self, const: GenericConst) -> None:
        size = _nbytes(const)
        if size >= LIFTED_BYTES:
            self.found[const.__chandle__()] = size


@relax.expr_functor.mutator
class _LargeConstantsToVars(relax.PyExprMutator):
    def __init__(self, large: dict[int, int]) -> None:
        super().__init__()
        self.large = large  # _LargeConstants.found
        self.lifted: dict[int, tuple[relax.Var, GenericConst]] = {}  # by the constant object

    def visit_generic_const_(self, const: GenericConst) -> relax.Expr:
        key = const.__chandle__()
        if key not in self.large:
            return const
        if key not in self.lifted:
            self.lifted[key] = (relax.Var(f"constant{len(self.lifted)}", const.ty), const)
        return self.lifted[key][0]


def _eliminate(func: relax.Function) -> relax.Function:
    large = _LargeConstants()
    large.visit_expr(func)
    if not large.found or sum(large.found.values()) < LIFT_MB * 2**20 * len(large.found):
        return _tvm_cse(func)
    lifter = _LargeConstantsToVars(large.found)
    lifted = lifter.visit_expr(func)
    variables = [var for var, _ in lifter.lifted.values()]
    opened = relax.Function(list(lifted.params) + variables, lifted.body, lifted.ret_ty, lifted.is_pure,
                            lifted.attrs, lifted.span)
    return _tvm_cse(opened).bind_params({var: const for var, const in lifter.lifted.values()})


def _tvm_cse(func: relax.Function) -> relax.Function:
    gvar = tvm.ir.GlobalVar("f")
    return relax.transform.EliminateCommonSubexpr()(tvm.IRModule({gvar: func}))[gvar]


@tvm.transform.module_pass(opt_level=0, name="relaxc.EliminateCommonSubexpr")
class EliminateCommonSubexpr:
    """TVM's common subexpression elimination, large constants compared by object where they are
    large enough that hashing their bytes would cost more than lifting them."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_relax_functions(mod, _eliminate)
