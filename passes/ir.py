"""What every relaxc pass needs from Relax IR: rewrites on a copy, operator tests, static shapes.

Why a copy: ``mod[gvar] = func`` updates an IRModule in place, and the pipeline keeps the module
after each phase for ``Artifact.ir(phase)``; a pass that assigned into its input would rewrite the
snapshots of earlier phases too (the layout pass's blocked convs showed up in the "simplify" IR).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir import GenericConst
from tvm.sym.analyzer import Analyzer

IS_SCHEDULED = "tirx.is_scheduled"  # set on every scheduled kernel; dlight and tuning skip those
SCHEDULE_ATTR = "relaxc.schedule"  # the label of what scheduled a kernel (a rule, the index checks)


OUT_ELEMWISE_FUSABLE = 4  # FuseOps' kOutEWiseFusable: takes an elementwise epilogue, fuses into nothing


def is_dynamic(func: tvm.tirx.PrimFunc) -> bool:
    """Whether a kernel has a buffer of a dynamic size (an expression of the model's dynamic dims)."""
    return any(not isinstance(d, tvm.tirx.IntImm) for param in func.params
               if isinstance(param.ty, tvm.tirx.BufferType) for d in param.ty.shape)


def map_relax_functions(mod: tvm.IRModule, rewrite: Callable[[relax.Function], relax.Function]) -> tvm.IRModule:
    """A copy of ``mod`` with every Relax function replaced by ``rewrite(function)``."""
    new = mod.clone()
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            new[gvar] = rewrite(func)
    return new


class MutatorPass:
    """The body of a module pass that runs one mutator over every Relax function: a subclass names
    the mutator class (built per module) and is decorated with ``tvm.transform.module_pass``."""

    mutator: type[relax.PyExprMutator]

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_relax_functions(mod, self.mutator(mod).visit_expr)


def rewrite_emitting(mod: tvm.IRModule, rewriter: relax.PyExprMutator) -> tvm.IRModule:
    """Every Relax function of ``mod`` rewritten by ``rewriter`` (built on ``mod.clone()``), with
    the PrimFuncs it emitted through its builder (``call_te``) added to the module."""
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
    return rewriter.builder_.get()


def is_op(expr: object, name: str) -> bool:
    """Whether ``expr`` is a call of the Relax operator ``name`` (e.g. ``"relax.add"``)."""
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name


def static_shape(expr: relax.Expr) -> tuple[int, ...] | None:
    """The shape of a tensor-typed ``expr`` if every dimension is a constant, else None."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = ty.shape.values
    if not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return tuple(int(d) for d in dims)


def dims_of(expr: relax.Expr) -> tuple | None:
    """The shape of a tensor-typed ``expr``: ints where a dim is constant, expressions of the
    dynamic dims elsewhere; None for a shape of unknown rank or computed at run time."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in ty.shape.values)


def batched_shape(expr: relax.Expr) -> tuple | None:
    """The shape of a tensor-typed ``expr`` whose dims are constants but perhaps the first (a
    dynamic batch, an expression), else None: what passes that lay out images take."""
    dims = dims_of(expr)
    return dims if dims is not None and all(isinstance(d, int) for d in dims[1:]) else None


def constant_ints(expr: relax.Expr) -> list[int] | None:
    """The integers of a tuple of ``PrimValue`` constants (a slice's axes, begins, ends), else None:
    a dynamic dim's extent among them."""
    if not isinstance(expr, relax.Tuple):
        return None
    values = [getattr(field, "value", field) for field in expr.fields]
    if not all(isinstance(v, (int, tvm.tirx.IntImm)) for v in values):
        return None
    return [int(v) for v in values]


def at_sizes(func: tvm.tirx.PrimFunc, sizes: dict[str, int]) -> tvm.tirx.PrimFunc:
    """``func`` with each dynamic dim named in ``sizes`` at that size: its scalar parameters of them
    specialised away (a dynamic key length a kernel takes), then every other use, the arithmetic of
    padded extents folded ((463 + 15) // 16 * 16 is 464): the static kernel of one call."""
    scalars = {p: tirx.const(sizes[p.name], p.ty.dtype) for p in func.params
               if not isinstance(p.ty, tirx.BufferType) and p.name in sizes}
    func = func.specialize(scalars) if scalars else func
    sized = lambda v, _kind: tirx.const(sizes[v.name], v.ty.dtype) if v.name in sizes else v  # noqa: E731
    func = tvm_ffi.structural_map(func, [], with_def_region_kind=[(tirx.Var, sized)])
    analyzer = Analyzer()
    constant = lambda e: analyzer.simplify(e) if not tirx.analysis.undefined_vars(e) else e  # noqa: E731
    return tvm_ffi.structural_map(func, ((tirx.Add, tirx.Sub, tirx.Mul, tirx.FloorDiv, tirx.FloorMod, tirx.Min,
                                          tirx.Max), constant))


def call_sizes(func: tvm.tirx.PrimFunc, shapes: list[tuple[int, ...]]) -> dict[str, int]:
    """Each dynamic dim of ``func``'s buffers at the size the tensors of one call (``shapes``, its
    buffer parameters' in order) give it."""
    buffers = [p for p in func.params if isinstance(p.ty, tvm.tirx.BufferType)]
    return {dim.name: size for param, shape in zip(buffers, shapes)
            for dim, size in zip(param.ty.shape, shape) if isinstance(dim, tvm.tirx.Var)}


TVM_ALIGNMENT = 64  # bytes: TVM wraps an array's memory as a tensor only at this alignment


def aligned_empty(shape: tuple[int, ...], dtype: str | np.dtype = "float32") -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts at a ``TVM_ALIGNMENT`` boundary, so
    ``constant`` can wrap it without a copy (numpy's own large arrays start 16 bytes past a page)."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(size + TVM_ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % TVM_ALIGNMENT
    return raw[start:start + size].view(dtype).reshape(shape)


def constant(array: np.ndarray) -> relax.Constant:
    """``relax.const(array)``, sharing the array's memory where TVM allows (C-contiguous, aligned:
    ``aligned_empty``) instead of copying it: packed weights are the model's largest arrays (the
    Winograd weights VGG-19 dispatches to are 334 MB; their copy into fresh pages cost about 0.2 s)."""
    if array.flags.c_contiguous and array.ctypes.data % TVM_ALIGNMENT == 0:
        return relax.const(tvm.runtime.from_dlpack(array))
    return relax.const(array)


def constant_array(expr: relax.Expr) -> np.ndarray | None:
    """The value of a Relax constant as a read-only numpy view of its memory (passes read weights
    without copying them: ``numpy()`` copied 52 of VGG-19's, 0.2 s), a copy where numpy has no such
    type (bfloat16); None for any other expression."""
    if not isinstance(expr, GenericConst):
        return None
    try:
        array = np.from_dlpack(expr.value)
    except RuntimeError:  # a dtype DLPack cannot hand numpy
        return expr.value.numpy()
    array.flags.writeable = False
    return array
