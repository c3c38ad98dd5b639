"""Each scheduled kernel told that the model's dynamic dims are at least 1 (a pass after scheduling).

TVM's arithmetic knows nothing of a kernel's dim variables, so under a loop fused over dynamic
extents it cannot prove ``i // ((s + 31) // 32)`` non-negative: buffer compaction then indexes a
register tile by offsets computed at run time (a tile LLVM keeps in memory, not in registers) and
integer division keeps its sign corrections. Inside the root block, each dim is bound to
``max(dim, 1)``, which the analyzer bounds below by 1, and its uses read that instead: BERT's
masked attention product took LLVM 4.0 s to build, and 0.12 s so. Run-time checks hold every dim
within 1..bound (``runtime.Runner``), so the value is the dim's own. A dim that may be 0 (a
decoder's past length: ``tir_var_lower_bound`` 0) keeps its own value.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from relaxc.passes.memory import main_bounds, main_empty_dims


def _dim_vars(func: tirx.PrimFunc, names: set[str]) -> list[tirx.Var]:
    """The variables of ``func``'s parameters (scalars and buffer dims) that are dims in ``names``."""
    found: dict[str, tirx.Var] = {}
    for param in func.params:
        exprs = list(param.ty.shape) if isinstance(param.ty, tirx.BufferType) else [param]
        for var in (v for e in exprs for v in tirx.analysis.undefined_vars(e)):
            if var.name in names:
                found.setdefault(var.name, var)
    return list(found.values())


def at_least_one(func: tirx.PrimFunc, names: set[str]) -> tirx.PrimFunc:
    """``func`` with the dims in ``names`` read inside its root block as ``max(dim, 1)``."""
    dims = _dim_vars(func, names)
    body = list(func.body.seq) if isinstance(func.body, tirx.SeqStmt) else [func.body]
    realize = body[-1]
    if not dims or not isinstance(realize, s_tir.SBlockRealize):
        return func
    root = realize.block
    bound = {v: tirx.Var(f"{v.name}_at_least_1", v.ty.dtype) for v in dims}
    inner = tvm_ffi.structural_map(root.body, [], with_def_region_kind=[(tirx.Var, lambda v, _k: bound.get(v, v))])
    binds = [tirx.Bind(bound[v], tirx.max(v, tirx.const(1, v.ty.dtype))) for v in dims]
    block = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, tirx.SeqStmt(binds + [inner]),
                         root.init, root.alloc_buffers, root.match_buffers, root.annotations)
    realize = s_tir.SBlockRealize(realize.iter_values, realize.predicate, block)
    return func.with_body(tirx.SeqStmt(body[:-1] + [realize]) if len(body) > 1 else realize)


@tvm.transform.module_pass(opt_level=0, name="relaxc.PositiveDims")
class PositiveDims:
    """Every kernel of a module with dynamic dims (``main``'s ``tir_var_upper_bound``) rewritten by
    ``at_least_one``; a static module is returned as it is."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        names = set(main_bounds(mod)) - main_empty_dims(mod)  # a dim that may be 0 is read as it is
        if not names:
            return mod
        new = mod.clone()
        for gvar, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc):
                new[gvar] = at_least_one(func, names)
        return new
