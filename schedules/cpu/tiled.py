"""The ``Tiled`` CPU rule: register-tiled reductions, everything else parallel and vectorised.

One rule covers conv (NCHW and blocked NCHWc), dense, pooling and reductions, because after
legalisation they share a shape: spatial loops then reduction loops. The innermost spatial axis
(contiguous in the output; the channel block in NCHWc) is vectorised, the next one is
register-tiled, and where the target has registers to spare so is an axis along which the operand
that is broadcast (not indexed by the vector axis) is reused: a blocked conv's output channel
chunks, so each input value feeds two or three weight vectors (a blocked conv's tile is as square
as the row allows, ``square_tile``: 4 x 4 rather than 8 x 2). The reduction runs inside the tile
with the accumulators in a local buffer, and everything outside the tile is fused into one
parallel loop, rows first where a conv's input outweighs its weights and output
(``input_dominates``: each thread then reads part of the input, not all of it; such a conv pads
its input per tile, ``pad_per_tile``), output channels first otherwise; a conv whose tile's
weights outgrow L1 (a pointwise one over many channels too) instead reduces in chunks, each
parallel iteration running a block of rows' tiles per chunk (``chunked_rows``), and a large
matrix-vector product (a classifier) sums its rows in parallel parts
(``_matrix_vector_in_parts``). Elementwise epilogues (bias, ReLU) are computed right after their
tile while it is hot. A kernel of another shape is not this rule's: it answers None and the next
rule (``Basic``) takes it. The tile's shape is decided in ``tile_plan.py``, the padding stages
scheduled in ``padding.py``.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import SBlockInfo, normalize_prim_func

from relaxc.schedules.cpu.padding import MAX_PADDED_GROUPS, inline_lane_padding, pad_per_tile, schedule_padding
from relaxc.schedules.cpu.rule import CpuRule
from relaxc.schedules.cpu.steps import (broadcasts, inline_elementwise, loop_extent, schedule_spatial, try_attach,
                                        vector_width, vectorize_innermost)
from relaxc.schedules.cpu.tile_plan import (MAX_WHOLE_ROW, MIN_ACCUMULATORS, broadcast_reuse, bytes_per, chunked_rows,
                                            input_dominates, operand_bytes, second_tile, square_tile, tile_factor)
from relaxc.support.targets import VectorUnit, accumulators
from relaxc.support.tvm_internals import UncheckedSchedule

LARGE_MATRIX = 1 << 18  # elements: a matrix-vector product this large streams its rows in parts
MATRIX_PARTS = (8, 4, 2)  # parts of the rows, the most that divide them
ROW_UNROLL = 4  # matrix rows per accumulator update in a part


def _spatial_then_reduction(info: SBlockInfo) -> bool:
    """Whether the block's loops are one or more spatial loops, then one or more reduction loops.

    A reduction whose reduction loops all have extent 1 has none left (ONNX ``Sum`` of one input, a
    pool window of one): there is no reduction to tile, and the next rule takes the kernel."""
    kinds = info.dom_kind()
    if "R" not in kinds or set(kinds) - {"S", "R"}:
        return False
    n_spatial = kinds.index("R")
    return n_spatial > 0 and "S" not in kinds[n_spatial:]


def _is_blocked_conv(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    return sch.get(block).name_hint.startswith("conv2d_NCHWc")


def _schedule_reduction(sch: s_tir.Schedule, info: SBlockInfo, unit: VectorUnit,
                        pads: list[SBlockInfo]) -> tuple[s_tir.schedule.LoopRV, s_tir.schedule.SBlockRV]:
    """Register-tile one (spatial-then-reduction) block, and compute the padding stages it reads
    (of ``pads``) per tile where that pays (``pad_per_tile``); returns the parallel loop its
    epilogue attaches to and the block that writes the accumulators back."""
    n_spatial = info.dom_kind().index("R")
    block = info.block_rv
    loops = sch.get_loops(block)
    spatial, reduction = loops[:n_spatial], loops[n_spatial:]
    lanes = unit.lanes
    if n_spatial == 1 and len(reduction) == 1:
        in_parts = _matrix_vector_in_parts(sch, block, spatial[0], reduction[0], lanes)
        if in_parts is not None:
            return in_parts
    width = vector_width(loop_extent(sch, spatial[-1]), lanes)
    reuse = broadcast_reuse(info, sch) if width > 1 else [False] * n_spatial
    input_bytes, weight_bytes, output_bytes = operand_bytes(info, sch)
    rows_first = width > 1 and n_spatial == 4 and input_dominates(input_bytes, weight_bytes, output_bytes)
    vec_outer, vec_inner = sch.split(spatial[-1], factors=[None, width])
    budget = accumulators(unit.registers)
    square = None
    if n_spatial >= 2:
        row = loop_extent(sch, spatial[-2])
        tile = tile_factor(row)
        if tile < MIN_ACCUMULATORS and row is not None and row <= MAX_WHOLE_ROW:
            tile = row
        if reuse[0] and (n_spatial == 4 or n_spatial == 3 and _is_blocked_conv(sch, block)):  # a blocked conv (1-D: H = 1 gone)
            square = square_tile(row, loop_extent(sch, spatial[0]), budget)
            if square is not None and square[1] == 1 and budget // tile < 2:
                square = None  # AVX2 on a 14- or 7-wide map: the row tile in the plain order
            tile = square[0] if square is not None else tile
        tile_outer, tile_inner = sch.split(spatial[-2], factors=[None, tile])
        outer = list(spatial[:-2]) + [tile_outer, vec_outer]
        inner = [tile_inner, vec_inner]
    else:
        tile = 1
        outer, inner = [vec_outer], [vec_inner]
    second = (0, square[1]) if square is not None else second_tile(sch, outer, reuse, tile, budget)
    if second is not None:
        index, factor = second
        outer[index], second_inner = sch.split(outer[index], factors=[None, factor])
        inner.insert(len(inner) - 1 if index == len(outer) - 1 else 0, second_inner)  # adjacent vectors: per row
    chunked = chunked_rows(sch, outer, reduction, second, width * bytes_per(info, sch), input_bytes, weight_bytes)
    if chunked is None:
        rows_outermost = rows_first and square is not None
        if rows_outermost:  # each thread reads part of the input, all the weights
            outer = [outer[1], outer[2], outer[0], outer[3]]
        sch.reorder(*outer, *reduction, *inner)
        if rows_outermost and (loop_extent(sch, outer[2]) or 0) <= MAX_PADDED_GROUPS:
            pad_per_tile(sch, block, reduction[0], lanes, pads)
        parallel = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        first_reduction = reduction[0]
    else:
        parallel_loops, first_reduction, inside = chunked
        sch.reorder(*parallel_loops, first_reduction, *inside, *inner)
        parallel = sch.fuse(*parallel_loops)
    sch.parallel(parallel)
    write_back = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write_back, parallel, preserve_unit_loops=True)
    # Vectorise before decomposing the reduction: the update block alone no longer counts as a
    # reduction, and TIR refuses to vectorise it then. The init block inherits the loop kinds.
    if width > 1:
        sch.vectorize(inner[-1])
    for loop in inner[:-1]:
        sch.unroll(loop)
    sch.decompose_reduction(block, first_reduction)
    vectorize_innermost(sch, write_back, lanes)
    return parallel, write_back


def _matrix_vector_in_parts(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, columns: s_tir.schedule.LoopRV,
                            depth: s_tir.schedule.LoopRV, lanes: int
                            ) -> tuple[s_tir.schedule.LoopRV, s_tir.schedule.SBlockRV] | None:
    """A vector times a matrix of ``LARGE_MATRIX`` elements or more (a classifier's FC over a
    row-major K x N weight): the K rows split in ``MATRIX_PARTS`` parts, in parallel, each part
    streaming its contiguous rows into partial sums (``rfactor``), ``ROW_UNROLL`` rows per update
    of the accumulators; then the parts summed, a vector of columns at a time. Returns the loop the
    epilogue attaches to and the block writing the sums back; None for another product.

    Split along N instead (the plain tiling: 5 chunks of 200 columns for N = 1000), each thread
    reads 800 bytes of every 4000-byte row, and 5 chunks run 3 on one thread and 2 on the other.
    ResNet-50's 2048 x 1000 FC in the model (2 cores): 0.35 ms in parts of rows against 0.52 split
    by columns (0.42-0.46 updating the accumulators every row; onnxruntime's 0.37)."""
    n, k = loop_extent(sch, columns), loop_extent(sch, depth)
    width = math.gcd(n or 0, lanes)  # a whole number of vectors per row: 8 lanes for N = 1000
    parts = next((p for p in MATRIX_PARTS if k and k % (p * ROW_UNROLL) == 0), None)
    if n is None or k is None or n * k < LARGE_MATRIX or width < MIN_ACCUMULATORS or parts is None \
            or not _rows_contiguous(sch, block):
        return None
    part, rows = sch.split(depth, factors=[parts, None])
    partial = sch.rfactor(part, 0)
    column, part, rows = sch.get_loops(partial)
    row_outer, row_inner = sch.split(rows, factors=[None, ROW_UNROLL])
    column_outer, column_inner = sch.split(column, factors=[None, width])
    sch.reorder(part, row_outer, column_outer, row_inner, column_inner)
    sch.parallel(part)
    sch.unroll(row_inner)
    sch.vectorize(column_inner)
    sch.decompose_reduction(partial, row_outer)
    column, part = sch.get_loops(block)
    column_outer, column_inner = sch.split(column, factors=[None, width])
    sch.reorder(column_outer, part, column_inner)
    sch.vectorize(column_inner)
    write_back = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(write_back, column_outer, preserve_unit_loops=True)
    sch.decompose_reduction(block, part)
    vectorize_innermost(sch, write_back, lanes)
    return column_outer, write_back


def _rows_contiguous(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether the block's reads indexed by both its loops (the matrix) run along the columns in
    their last dimension: rows of the matrix lie contiguous in memory (not an N x K weight)."""
    column, depth = (v.var.name for v in sch.get(block).iter_vars)
    for read in sch.get(block).reads:
        names = [{v.name for v in tirx.analysis.undefined_vars(r.min)} for r in read.region]
        if set().union(*names) >= {column, depth} and column not in names[-1]:
            return False
    return True


class Tiled(CpuRule):
    """Register-tiled reductions with their epilogues; None for a kernel of another shape."""

    def schedule(self, func: tirx.PrimFunc, unit: VectorUnit) -> s_tir.Schedule | None:
        return _tiled(func, unit)


def _tiled(func: tirx.PrimFunc, unit: VectorUnit) -> s_tir.Schedule | None:
    lanes = unit.lanes
    sch = UncheckedSchedule(func)
    blocks = normalize_prim_func(sch)
    if blocks is None:
        return None
    blocks = inline_elementwise(sch, blocks)
    if not all(_spatial_then_reduction(b) for b in blocks if b.is_reduction()):
        return None
    blocks = inline_lane_padding(sch, blocks, lanes)
    pads = [b for b in blocks if b.is_data_pad(sch)]  # scheduled last: a conv may compute them per tile
    anchor = write_back = reduction = None
    epilogue, apart = False, False  # blocks after the reduction computed in its tile, and not
    for info in blocks:
        block = info.block_rv
        if info in pads:
            continue
        if info.is_reduction():
            apart = apart or anchor is not None  # a second reduction: keep the first one's buffer
            anchor, write_back = _schedule_reduction(sch, info, unit, pads)
            reduction = block
        elif anchor is not None and not broadcasts(sch, block, reduction) and try_attach(sch, block, anchor):
            epilogue = True
            vectorize_innermost(sch, block, lanes)
        else:
            apart = apart or anchor is not None
            schedule_spatial(sch, block, lanes)
    for pad in (p for p in pads if sch.get(p.block_rv).writes[0].source.scope() != "local"):
        schedule_padding(sch, pad, lanes)  # a padded copy of the whole input, before its conv
    if epilogue and not apart:
        sch.compute_inline(write_back)  # the epilogue reads the accumulators: no output-sized buffer
    return sch
