"""The next parallel iteration's weights prefetched while this one computes (a pass of the ``relaxc``
TIR pipeline, ``passes/tir/tir_pipeline.py``).

Why: a packed matmul (``schedules/cpu/dense.py``: Winograd's products, transformers' dense layers)
runs one weight panel per parallel iteration, every register tile of rows against it. In a model
the panel comes from L3 or memory: the first row tile stalls on it (the hardware prefetchers do
not run ahead across 4 KiB pages), the others find it in L2, so the memory traffic comes in bursts
and overlaps with no computation. ResNet-50's 14x14 F(2x2) product (16 x 54 x 256 x 256, 4.2 MB of
transformed weights, 2 threads) takes 0.39 ms with its operands in cache and 0.78-0.85 ms with
every cache flushed; prefetching the next panel, one cache line per iteration of the reduction
loop, brings the flushed runs to 0.66-0.68 ms.

How: the schedule marks the loop over the row tiles with ``ATTR`` and the weights' buffer name
and panel size in elements (``mark``); TVM's lowering keeps it as a ``pragma_`` attribute around
the loop. This pass finds the parallel loop around it (iteration ``p`` reads elements
``[p * span, (p + 1) * span)`` of the weights) and the reduction loop inside it (the first loop
that reads the weights), and issues in that loop's body a prefetch of the line
``(row * K + k) / stride`` of panel ``p + 1``: the panel's lines spread over the iterations. An
x86 prefetch never faults, so the last iteration's prefetch past the end of the weights is harmless.
A mark whose loops are not found is dropped.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

ATTR = "pragma_relaxc_prefetch"  # "<weights buffer name> <elements per parallel iteration>"
LINE_BYTES = 64
MAX_LINES_PER_ITERATION = 8
LOCALITY = 2  # into L2 (prefetcht1), not L1: a 32 KiB panel prefetched into L1 evicts the one in use


def mark(buffer_name: str, span: int) -> str:
    """The value of ``ATTR`` for a loop whose parallel iteration ``p`` reads ``span`` elements of
    ``buffer_name`` from ``p * span``."""
    return f"{buffer_name} {span}"


def _loads_of(stmt: tirx.Stmt, name: str) -> list[tvm.ir.TensorLoad]:
    found = []
    tvm_ffi.structural_map(stmt, (tvm.ir.TensorLoad, lambda load: found.append(load) or load
                                  if load.source.name == name else load))
    return found


def _first_loop_reading(stmt: tirx.Stmt, name: str) -> tirx.For | None:
    """The outermost loop in ``stmt`` whose body reads buffer ``name``."""
    found = []

    def visit(loop: tirx.For) -> tirx.For:
        if _loads_of(loop.body, name):
            found.append(loop)  # post order: inner loops first
        return loop

    tvm_ffi.structural_map(stmt, (tirx.For, visit))
    return found[-1] if found else None


def _prefetching(attr: tirx.AttrStmt, parallel: tirx.Var) -> tirx.Stmt:
    """The loop under ``attr`` with the prefetches in its reduction loop (see the module docstring),
    or the loop unchanged if its shape is not the expected one."""
    rows = attr.body
    name, span = str(attr.value.value).split()
    span = int(span)
    reduction = _first_loop_reading(rows.body, name) if isinstance(rows, tirx.For) else None
    if reduction is None or not isinstance(rows.extent, tirx.IntImm) or not isinstance(reduction.extent, tirx.IntImm):
        return rows
    weights = _loads_of(reduction.body, name)[0].source
    elements = LINE_BYTES * 8 // weights.dtype.bits
    lines = -(-span // elements)
    iterations = int(rows.extent) * int(reduction.extent)
    per_iteration = min(-(-lines // iterations), MAX_LINES_PER_ITERATION)
    stride = max(iterations // lines, 1)
    dtype = str(reduction.loop_var.ty)
    cast = lambda var: var if str(var.ty) == dtype else tirx.Cast(dtype, var)  # noqa: E731
    counter = cast(rows.loop_var) * int(reduction.extent) + reduction.loop_var
    base = (cast(parallel) + 1) * span + counter // stride * per_iteration * elements
    prefetches = [tirx.Evaluate(tirx.call_intrin(
        "void", "tirx.prefetch", tirx.address_of(tirx.BufferLoad(weights, [base + j * elements])), 0, LOCALITY, 1))
        for j in range(per_iteration)]
    body = tirx.SeqStmt([*prefetches, reduction.body])
    inner = tirx.For(reduction.loop_var, reduction.min, reduction.extent, reduction.kind, body,
                     reduction.thread_binding, reduction.annotations, reduction.step)
    return tvm_ffi.structural_map(rows, (tirx.For, lambda loop: inner if loop.same_as(reduction) else loop))


def _in_parallel_loop(loop: tirx.For) -> tirx.For:
    if loop.kind != tirx.ForKind.PARALLEL:
        return loop
    return tvm_ffi.structural_map(loop, (tirx.AttrStmt, lambda attr: _prefetching(attr, loop.loop_var)
                                         if attr.attr_key == ATTR else attr))


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="relaxc.PrefetchNextPanel")
def PrefetchNextPanel(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tirx.PrimFunc:
    """Marked loops get their prefetches; marks outside a parallel loop are dropped."""
    func = tvm_ffi.structural_map(func, (tirx.For, _in_parallel_loop))
    return tvm_ffi.structural_map(func, (tirx.AttrStmt, lambda attr: attr.body if attr.attr_key == ATTR else attr))
