"""Small kernel-local buffers on the stack, not in TVM's workspace pool (a pass of the ``relaxc`` TIR
pipeline, ``passes/tir/tir_pipeline.py``).

TVM 0.27's ``LowerTVMBuiltin`` puts a buffer on the stack only if its scope is ``global`` and it
holds under 1 KiB; every other allocation becomes a ``TVMBackendAllocWorkspace`` /
``TVMBackendFreeWorkspace`` pair of calls where the buffer lives. A register tile's accumulators
(a ``local`` cache of at most a few KiB, declared in the parallel loop's body) were therefore
allocated and freed once per tile, and LLVM, seeing memory returned by an opaque call, kept the
accumulators of branchy loops (a depthwise conv testing its padding) in that memory: the
EfficientNet depthwise conv 0.137 -> 0.057 ms, a 1x1 conv 0.30 -> 0.19 ms when on the stack.

The pass marks every allocation of constant size up to ``MAX_STACK_BYTES`` with TVM's
``disable_lower_builtin`` annotation, which ``LowerTVMBuiltin`` leaves to LLVM's code generator: an
``alloca`` in the function's entry block (the parallel body's, for buffers declared in it), which
LLVM promotes to registers where it can. Bigger or dynamic buffers keep the workspace pool.
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import tirx

MAX_STACK_BYTES = 16 * 1024  # far below a thread's stack (8 MiB) even with several such buffers live
DISABLE_LOWER_BUILTIN = "disable_lower_builtin"  # TVM's transform::kDisableLowerTVMBuiltin


def _constant_bytes(buffer: tvm.ir.expr.Var) -> int | None:
    """The buffer's size if it is constant and not of booleans: TVM's LLVM code for a stack buffer
    of booleans mixes i1 and i8 vectors and fails verification (BERT's attention mask)."""
    dtype = tvm.DataType(str(buffer.dtype))
    if dtype.type_code == tvm.DataTypeCode.BOOL or not all(isinstance(extent, tirx.IntImm) for extent in buffer.shape):
        return None
    return math.prod(int(extent) for extent in buffer.shape) * dtype.lanes * dtype.bits // 8


def _on_stack(alloc: tirx.AllocBuffer) -> tirx.AllocBuffer:
    size = _constant_bytes(alloc.buffer)
    if size is None or size > MAX_STACK_BYTES or DISABLE_LOWER_BUILTIN in alloc.annotations:
        return alloc
    annotations = {**alloc.annotations, DISABLE_LOWER_BUILTIN: tirx.IntImm("int32", 1)}
    return tirx.AllocBuffer(alloc.buffer, annotations=annotations, span=alloc.span)


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="relaxc.StackBuffers")
def StackBuffers(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tirx.PrimFunc:
    """Small constant-size allocations become stack allocations (see the module docstring)."""
    return tvm_ffi.structural_map(func, (tirx.AllocBuffer, _on_stack))
