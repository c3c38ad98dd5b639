"""The ``Dense`` CPU rule: the packed-weight matmul kernels of ``passes/dense.py``.

Loop order is what the packing is for: the weight panels (``N / panel`` of them, each K x panel,
contiguous) are the parallel loop, and inside each, every register tile of rows runs the whole K
loop against the panel while it sits in L2; the weights are read from memory once per inference.
The register tile is the one ``passes/dense.py`` chose for the target's registers (its rows
annotated on the block, its columns the panel), rows unrolled, columns vectorised. The epilogue
(bias, GELU, residual add; the padding sliced off) runs on each tile right after it is computed,
reading the accumulators, so no M x N product is written and read back (GPT-2's LM head: 12.9 MB);
when x has batch dims it is a stage of its own (``_schedule_dense`` says why). Measured in the
``passes/dense.py`` docstring.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func

from relaxc.passes.tir import prefetch
from relaxc.passes.dense import PANEL_ATTR, ROW_TILE_ATTR, TILE_ALIGNED_ATTR
from relaxc.schedules.cpu.int8 import intrinsic
from relaxc.schedules.cpu.rule import CpuRule, kernel_blocks
from relaxc.schedules.cpu.steps import (L1_BYTES, index_names, inline_elementwise, loop_extent, schedule_spatial,
                                        try_attach, vectorize_innermost)
from relaxc.support.errors import DoesNotFit
from relaxc.support.targets import ByteDot, VectorUnit
from relaxc.support.tvm_internals import UncheckedSchedule

BLOCK = "dense_packed"
ROWS_PAD = "dense_rows_pad"


class Dense(CpuRule):
    """Schedules kernels that contain a ``dense_packed`` block; None for any other kernel."""

    def may_fit(self, func: tirx.PrimFunc) -> bool:
        return any(block.name_hint == BLOCK for block in kernel_blocks(func))

    def schedule(self, func: tirx.PrimFunc, unit: VectorUnit) -> s_tir.Schedule | None:
        lanes = unit.lanes
        sch = UncheckedSchedule(func)
        try:
            sch.get_sblock(BLOCK)
        except (s_tir.ScheduleError, ValueError):  # how TVM says no block, or several, has the name
            return None
        blocks = normalize_prim_func(sch)
        if blocks is None:
            return None
        pad = [b for b in blocks if b.name == ROWS_PAD]  # a stage of its own: inlined, every load would test its row
        blocks = pad + inline_elementwise(sch, [b for b in blocks if b.name != ROWS_PAD])
        tile = write_back = None
        apart = False  # an epilogue stage of its own, which reads the product from memory
        for info in blocks:
            if info.name == BLOCK:
                tile, write_back = _schedule_dense(sch, info.block_rv, unit)
            elif tile is not None and try_attach(sch, info.block_rv, tile):
                vectorize_innermost(sch, info.block_rv, lanes)
            else:
                apart = apart or write_back is not None
                schedule_spatial(sch, info.block_rv, lanes)
        if tile is not None and not apart:
            sch.compute_inline(write_back)  # the epilogue reads the tile's registers: no M x N buffer
        return sch


def _schedule_dense(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV,
                    unit: VectorUnit) -> tuple[s_tir.schedule.LoopRV | None, s_tir.schedule.SBlockRV]:
    """Tile the product; returns the loop its epilogue attaches to (the row tile's), or None when
    x has several matrices (batch dims): then the epilogue is a parallel stage of its own; and the
    block writing the accumulators back. TVM infers the region an epilogue needs under a loop
    through the flattening (r // M, r % M) as a box, which for a tile straddling two matrices, or
    for padded rows, is not the tile: it read rows other tiles compute later, or skipped some (wrong
    results; the fuzzer found them)."""
    if unit.bytes is not None and _operand_dtypes(sch.get(block)) == (unit.bytes.data, unit.bytes.weights, "int32"):
        return _schedule_bytes(sch, block, unit.bytes)
    lanes = unit.lanes
    loops = sch.get_loops(block)
    if len(loops) not in (3, 4):  # TVM drops unit loops; passes/dense.py packs no single row and no K = 1
        raise DoesNotFit(f"dense_packed with {len(loops)} loops, expected [matrices,] rows, columns, depth")
    *matrices, rows, columns, depth = loops  # matrices: Winograd's products, one per tile position
    annotations = sch.get(block).annotations
    panel = int(annotations[PANEL_ATTR])
    aligned = bool(int(annotations[TILE_ALIGNED_ATTR]))
    row_outer, row_inner = sch.split(rows, factors=[None, int(annotations[ROW_TILE_ATTR])])
    panel_outer, panel_inner = sch.split(columns, factors=[None, panel])
    vector_outer, vector_inner = sch.split(panel_inner, factors=[None, min(lanes, panel)])
    outer = [panel_outer, *matrices] if _shares_weights(sch.get(block), len(matrices)) else [*matrices, panel_outer]
    sch.reorder(*outer, row_outer, depth, row_inner, vector_outer, vector_inner)
    sch.parallel(sch.fuse(*outer) if matrices else panel_outer)
    write_back = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write_back, row_outer, preserve_unit_loops=True)
    sch.vectorize(vector_inner)
    sch.unroll(row_inner)
    sch.unroll(vector_outer)
    sch.decompose_reduction(block, depth)
    vectorize_innermost(sch, write_back, lanes)
    _mark_prefetch(sch, block, row_outer, panel * (loop_extent(sch, depth) or 0))
    return (row_outer if aligned else None), write_back


def _shares_weights(block: tirx.SBlock, matrices: int) -> bool:
    """Whether a product over ``matrices`` leading dims reads one weight for all of them (a dense
    layer over batch x sequence rows, not Winograd's products): then each panel runs every matrix's
    rows while it sits in L2, panels outermost (GPT-2's projections at batch 4 x sequence 16,
    batch outermost: each panel read 4 times, the kernel 22 % slower than over the rows flat)."""
    if not matrices:
        return False
    names = [v.var.name for v in block.iter_vars]
    weights = [read for read in block.reads if names[matrices] not in index_names(read)]
    return bool(weights) and not any(index_names(read) & set(names[:matrices]) for read in weights)


def _mark_prefetch(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, row_outer: s_tir.schedule.LoopRV,
                   span: int) -> None:
    """Mark the row tiles' loop for ``passes/tir/prefetch.py`` where a weight panel (``span`` elements,
    0 if not static) outgrows L1; a panel L1 holds is read from it by every row tile."""
    stmt = sch.get(block)
    columns = stmt.iter_vars[-2].var.name  # spatial iterators ([matrix,] rows, columns), then the reduction
    weights = [read.source for read in stmt.reads if not any(read.source.same_as(w.source) for w in stmt.writes)
               and columns in index_names(read)]
    if len(weights) == 1 and span * weights[0].dtype.bits // 8 >= L1_BYTES:
        sch.annotate(row_outer, prefetch.ATTR, prefetch.mark(weights[0].name, span))


def _schedule_bytes(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV,
                    dot: ByteDot) -> tuple[s_tir.schedule.LoopRV | None, s_tir.schedule.SBlockRV]:
    """A uint8 x int8 product (``pack_bytes`` weights) on the byte dot product ``dot``: each tile's
    rows by its panel's vectors of int32 accumulators, each instruction adding a broadcast group of
    a row's bytes times a vector's weights; the tiles of all panels (of all matrices: the integer
    Winograd's products) in one parallel loop."""
    loops = sch.get_loops(block)
    *matrices, rows, columns, depth = loops if len(loops) > 2 else [None, *loops]  # one row: no loop
    annotations = sch.get(block).annotations
    panel = int(annotations[PANEL_ATTR])
    row_outer, row_inner = ([[loop] for loop in sch.split(rows, factors=[None, int(annotations[ROW_TILE_ATTR])])]
                            if rows else ([], []))
    panel_outer, vectors, lane = sch.split(columns, factors=[None, panel // dot.lanes, dot.lanes])
    group, byte = sch.split(depth, factors=[None, dot.depth])
    sch.reorder(*matrices, panel_outer, *row_outer, group, *row_inner, vectors, lane, byte)
    tiles = sch.fuse(*matrices, panel_outer, *row_outer) if matrices or row_outer else panel_outer
    sch.parallel(tiles)
    write_back = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write_back, tiles, preserve_unit_loops=True)
    init = sch.decompose_reduction(block, group)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.tensorize(lane, intrinsic(dot))
    for loop in (*row_inner, vectors):
        sch.unroll(loop)
    vectorize_innermost(sch, write_back, dot.lanes)
    return (tiles if int(annotations[TILE_ALIGNED_ATTR]) else None), write_back


def _operand_dtypes(block: s_tir.SBlock) -> tuple[str, ...]:
    return tuple(str(region.source.dtype) for region in (*block.reads[-2:], block.writes[0]))
