"""The ``Rows`` CPU rule: kernels that reduce each row of a tensor over its last axis and use the
result on that row (softmax, LayerNorm, RMSNorm, mean and variance over the last axis), fused with
their elementwise neighbours and the attention mask.

Every block is computed inside one parallel loop over the rows, so a row is read from memory once
and its max, sums and normalised values are made while it is in L1 (the ``Tiled`` rule parallelised
each block on its own and vectorised along the rows, which are not contiguous: scalar code, and each
stage streamed the whole tensor again). Along the row, loops are vectorised where a vector width
divides them; others (ViT's 197 tokens) are left to LLVM's loop vectoriser, which handles the tail.
The reductions themselves run in ``lanes`` partial results, one vector, when the row divides into
vectors (rfactor), so a sum or max is not one long chain of dependent scalar operations. Kernels of
any other shape answer None.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import SBlockInfo, normalize_prim_func

from schedules.cpu.rule import CpuRule
from schedules.cpu.tiled import loop_extent, vectorize_innermost
from support.targets import VectorUnit


def _row_reduction(info: SBlockInfo) -> bool:
    """Spatial loops then exactly one reduction loop: a reduction over the innermost axis."""
    kinds = info.dom_kind()
    return len(kinds) >= 2 and kinds[-1] == "R" and set(kinds[:-1]) == {"S"}


def is_product_sum(block: s_tir.SBlock) -> bool:
    """Whether the block sums products of two different tensor elements (a matmul or a conv,
    which the other rules tile); a sum of squares (RMSNorm) is not one."""
    body = block.body
    value = body.value if isinstance(body, tirx.BufferStore) else None
    product = value.b if isinstance(value, tirx.Add) and isinstance(value.b, tirx.Mul) else None
    return product is not None and all(isinstance(f, tvm.ir.TensorLoad) for f in (product.a, product.b)) \
        and not tvm_ffi.structural_equal(product.a, product.b)


class Rows(CpuRule):
    """Row-parallel reductions over the last axis with their elementwise neighbours."""

    def schedule(self, func: tirx.PrimFunc, unit: VectorUnit) -> s_tir.Schedule | None:
        return _rows(func, unit.lanes)


def _rows(func: tirx.PrimFunc, lanes: int) -> s_tir.Schedule | None:
    sch = s_tir.Schedule(func)
    blocks = normalize_prim_func(sch)
    if blocks is None:
        return None
    reductions = [b for b in blocks if b.is_reduction()]
    if not reductions or not all(_row_reduction(b) and not is_product_sum(sch.get(b.block_rv)) for b in reductions):
        return None
    _inline_single_use(sch, blocks)
    partials = [_partial_sums(sch, b.block_rv, lanes) for b in reductions]  # before compute_at: rfactor needs root blocks
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    anchor = blocks[-1]
    loops = sch.get_loops(anchor)
    if len(loops) < 2:
        return None
    row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    sch.parallel(row)
    for block in reversed(blocks[:-1]):
        sch.compute_at(block, row, preserve_unit_loops=True)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if not any(v.iter_type == tirx.IterVar.CommReduce for v in sch.get(block).iter_vars):
            vectorize_innermost(sch, block, lanes)  # where a width divides the row; else LLVM's vectoriser
    for partial in filter(None, partials):
        _vectorize_partial(sch, partial)
    return sch


def _inline_single_use(sch: s_tir.Schedule, blocks: list[SBlockInfo]) -> None:
    """Inline elementwise blocks read by one block (a mask, a cast); a value two blocks read (the
    exponentials of a softmax, read by its sum and its normalisation) is computed once."""
    for info in blocks:
        if info.is_reduction() or len(sch.get_consumers(info.block_rv)) != 1:
            continue
        try:
            sch.compute_inline(info.block_rv)
        except s_tir.ScheduleError:
            pass


def _partial_sums(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, lanes: int) -> s_tir.schedule.SBlockRV | None:
    """Split a reduction whose row divides into vectors into ``lanes`` partial results (rfactor):
    returns the block computing them, or None (the row stays one scalar chain)."""
    inner = sch.get_loops(block)[-1]
    extent = loop_extent(sch, inner)
    if extent is None or extent % lanes or extent == lanes:
        return None
    _, vector = sch.split(inner, factors=[None, lanes])
    return sch.rfactor(vector, 0)


def _vectorize_partial(sch: s_tir.Schedule, partial: s_tir.schedule.SBlockRV) -> None:
    """The partial-sum block, moved into the row loop, has its loops in the order of its iterators:
    (the lane, the row's unit loops, the reduction); the lane goes innermost and is vectorised."""
    loops = sch.get_loops(partial)
    sch.reorder(loops[-1], loops[1])
    loops = sch.get_loops(partial)
    sch.vectorize(loops[-1])
    sch.decompose_reduction(partial, loops[1])
