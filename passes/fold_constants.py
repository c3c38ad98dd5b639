"""Constant folding in numpy for the cheap operators that importers leave on constants.

Relax's own ``FoldConstant`` JIT-compiles every foldable call through LLVM: on ResNet-50 that costs
about 20 s, almost all of it spent on broadcasts of scalar fills, reshapes of biases and the
arithmetic of batch-norm decomposition. These are exact in numpy (same fp32 IEEE operations), so
they are folded here; whatever is not in the table is left to ``FoldConstant``, which
``FoldRemainingConstants`` runs only where something is left for it.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst
from tvm.tirx import FloatImm, IntImm

from relaxc.passes.ir import aligned_empty, constant, constant_array, map_relax_functions, static_shape

_ELEMENTWISE: dict[str, Callable[..., np.ndarray]] = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
    "relax.maximum": np.maximum,
    "relax.minimum": np.minimum,
    "relax.power": np.power,
    "relax.sqrt": np.sqrt,
    "relax.rsqrt": lambda x: np.reciprocal(np.sqrt(x)),
    "relax.negative": np.negative,
    "relax.exp": np.exp,
    "relax.less": np.less,  # the importer's Gather wraps negative indices: where(i < 0, i + n, i)
    "relax.greater": np.greater,
    "relax.less_equal": np.less_equal,
    "relax.greater_equal": np.greater_equal,
    "relax.equal": np.equal,
    "relax.not_equal": np.not_equal,
    "relax.where": np.where,
}
# Operators whose result is fully described by the input values and the output shape.
_RESHAPING = {"relax.reshape", "relax.broadcast_to", "relax.expand_dims", "relax.squeeze",
              "relax.flatten"}


def _value(arg: relax.Expr) -> np.ndarray | float | tuple | None:
    if (array := constant_array(arg)) is not None:
        return array
    if isinstance(arg, relax.ShapeExpr) and all(isinstance(v, IntImm) for v in arg.values):
        return tuple(int(v) for v in arg.values)
    if isinstance(arg, (FloatImm, IntImm)):
        return arg.value
    if isinstance(arg, relax.Tuple):  # a strided slice's axes, begins, ends
        values = [_value(field) for field in arg.fields]
        return None if any(v is None for v in values) else tuple(values)
    return None


def _evaluate(call: relax.Call, args: list) -> np.ndarray | None:
    name = call.op.name
    out = call.ty
    if not isinstance(out, relax.TensorType) or out.shape is None or out.dtype is None:
        return None
    shape = tuple(int(d) for d in out.shape.values)
    if name in _ELEMENTWISE:
        result = _ELEMENTWISE[name](*args)
    elif name in _RESHAPING:
        result = np.broadcast_to(args[0], shape) if name == "relax.broadcast_to" else np.reshape(args[0], shape)
    elif name == "relax.permute_dims":
        axes = call.attrs.axes
        result = np.transpose(args[0], None if axes is None else [int(a) for a in axes])
    elif name == "relax.astype":
        result = args[0]
    elif name == "relax.shape_to_tensor":
        result = np.asarray(args[0], np.int64)
    elif name == "relax.take":  # "fast" assumes the indices in bounds: numpy checks
        try:
            result = np.take(args[0], args[1], axis=int(call.attrs.axis),
                             mode={"fast": "raise"}.get(call.attrs.mode, call.attrs.mode))
        except IndexError:
            return None
    elif name == "relax.strided_slice":
        steps = args[4] if len(args) > 4 else (1,) * len(args[1])
        index = [slice(None)] * np.ndim(args[0])
        for axis, begin, end, step in zip(args[1], args[2], args[3], steps):
            index[axis] = slice(begin, end, step)
        result = args[0][tuple(index)]
    else:
        return None
    # one copy, cast on the way, into memory the constant then shares (the result's astype, its
    # contiguous copy and the constant's own copy took VGG-19's simplify 1.2 s more)
    folded = aligned_empty(shape, str(out.dtype))
    _copy(folded, np.asarray(result).reshape(shape))
    return folded


def _copy(out: np.ndarray, value: np.ndarray, tile: int = 256) -> None:
    """``value`` into ``out``; a transposed matrix (a Gemm's ``transB`` weight) tile by tile, so
    that both sides of a tile stay in cache (VGG-19's 411 MB classifier weight: 0.55 -> 0.25 s)."""
    if value.ndim != 2 or not 0 < value.strides[0] < value.strides[1]:  # not transposed (or broadcast rows)
        np.copyto(out, value, casting="unsafe")
        return
    for i in range(0, out.shape[0], tile):
        for j in range(0, out.shape[1], tile):
            np.copyto(out[i:i + tile, j:j + tile], value[i:i + tile, j:j + tile], casting="unsafe")


@relax.expr_functor.mutator
class _NumpyFolder(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        if call.op.name == "relax.shape_of" and (shape := static_shape(call.args[0])) is not None:
            return relax.ShapeExpr(list(shape))  # the importer's Gather reads the data's shape to wrap indices
        args = []
        for arg in call.args:
            if isinstance(arg, relax.Var):
                arg = self.lookup_binding(arg)
            value = _value(arg) if arg is not None else None
            if value is None:
                return call
            args.append(value)
        folded = _evaluate(call, args)
        return call if folded is None else constant(folded)


@tvm.transform.module_pass(opt_level=0, name="relaxc.FoldConstantsNumpy")
class FoldConstantsNumpy:
    """Fold calls on constants of the operators listed above, evaluated by numpy."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_relax_functions(mod, _NumpyFolder().visit_expr)


def _computes_from_constants(func: relax.Function) -> bool:
    """Whether some binding of ``func`` is computed from no value that depends on its parameters
    (only constants, shapes, literals): all that TVM's ``FoldConstant`` could fold. Conservative:
    any such binding counts, foldable by TVM or not."""
    dependent = set(func.params)
    for block in func.body.blocks if isinstance(func.body, relax.SeqExpr) else []:
        for binding in block.bindings:
            if isinstance(binding.value, GenericConst):
                continue
            if any(var in dependent for var in relax.analysis.free_vars(binding.value)):
                dependent.add(binding.var)
            else:
                return True
    return False


@relax.expr_functor.mutator
class _ConstantsInPlace(relax.PyExprMutator):
    """Every use of a variable bound to a constant becomes the constant, as ``FoldConstant`` leaves
    them (the passes after it match constant operands in place: ``x / c`` in
    ``canonicalize/elementwise.py``)."""

    def visit_var_(self, var: relax.Var) -> relax.Expr:
        bound = self.lookup_binding(var)
        return bound if isinstance(bound, GenericConst) else var

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> relax.Expr:
        return self.visit_var_(var)


@tvm.transform.module_pass(opt_level=0, name="relaxc.FoldRemainingConstants")
class FoldRemainingConstants:
    """TVM's ``FoldConstant`` for what the numpy folder leaves, run only on a module where some
    binding is computed from constants alone: the pass legalizes every operator to TIR before it
    looks at the operands (ResNet-50: 227 operators, 0.23 s), and after the numpy folder there is
    usually nothing left for it. Elsewhere only its other effect: constants used in place."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        functions = [f for f in mod.functions.values() if isinstance(f, relax.Function)]
        if any(_computes_from_constants(f) for f in functions):
            return relax.transform.FoldConstant()(mod)
        return map_relax_functions(mod, _ConstantsInPlace().visit_expr)
