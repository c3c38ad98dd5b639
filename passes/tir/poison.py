"""Kernel-local buffers filled with garbage where they are allocated, in ``validate_memory`` mode (a pass
of the ``relaxc`` TIR pipeline, ``passes/tir/tir_pipeline.py``).

The arena fill (``passes/memory.py``) shows a kernel reading a tensor no kernel wrote; a kernel's own
scratch (a register tile's accumulators, a reduction's partial sums) is allocated inside the kernel and
was out of its reach. A kernel that reads scratch it did not write computes from whatever the
allocator left there: zeros in a fresh page, an earlier tile's values in a reused one, so the fault
shows on some sizes, thread counts and runs and not others (a decoder's one-token attention, from 10
heads on). Filled with the largest finite value of its type, such a read shows in the outputs at once.

``PoisonScratch`` marks the kernels of a module compiled with ``validate_memory``; the TIR pass
``FillScratch`` fills every allocation of the kernels so marked, and leaves the others alone.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

POISON_ATTR = "relaxc.poison_scratch"


def garbage(dtype: str) -> tirx.PrimExpr:
    """What a poisoned buffer holds: its type's largest finite value (true for booleans), in every lane."""
    kind = tvm.DataType(dtype)
    scalar = kind.with_lanes(1) if kind.lanes > 1 else kind
    value = tirx.const(True, str(scalar)) if kind.type_code == tvm.DataTypeCode.BOOL else tirx.max_value(str(scalar))
    return tirx.Broadcast(value, kind.lanes) if kind.lanes > 1 else value


def _fill(buffer: tirx.Buffer) -> tirx.Stmt:
    """A loop nest writing ``garbage`` over every element of ``buffer``."""
    indices = [tirx.Var(f"poison_{axis}", extent.ty.dtype if hasattr(extent, "ty") else "int32")
               for axis, extent in enumerate(buffer.shape)]
    body: tirx.Stmt = tirx.BufferStore(buffer, garbage(str(buffer.dtype)), indices)
    for index, extent in reversed(list(zip(indices, buffer.shape))):
        body = tirx.For(index, tirx.const(0, index.ty.dtype), extent, tirx.ForKind.SERIAL, body)
    return body


def _filled(seq: tirx.SeqStmt) -> tirx.SeqStmt:
    stmts = []
    for stmt in seq.seq:
        stmts.append(stmt)
        if isinstance(stmt, tirx.AllocBuffer):
            stmts.append(_fill(stmt.buffer))
    return tirx.SeqStmt(stmts) if len(stmts) != len(seq.seq) else seq


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="relaxc.FillScratch")
def FillScratch(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tirx.PrimFunc:
    """Every allocation of a kernel marked ``POISON_ATTR`` followed by a fill with ``garbage``."""
    if not (func.attrs or {}).get(POISON_ATTR):
        return func
    return tvm_ffi.structural_map(func, (tirx.SeqStmt, _filled))


@tvm.transform.module_pass(opt_level=0, name="relaxc.PoisonScratch")
def PoisonScratch(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Mark every kernel of ``mod`` for ``FillScratch``."""
    mod = mod.clone()
    for gvar, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc):
            mod[gvar] = func.with_attr(POISON_ATTR, tirx.IntImm("int32", 1))
    return mod
