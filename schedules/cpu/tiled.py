"""The ``Tiled`` CPU rule: register-tiled reductions, everything else parallel and vectorised.

One rule covers conv (NCHW and blocked NCHWc), dense, pooling and reductions, because after
legalisation they share a shape: spatial loops then reduction loops. The innermost spatial axis
(contiguous in the output; the channel block in NCHWc) is vectorised, the next one is
register-tiled, and where the target has registers to spare so is an axis along which the operand
that is broadcast (not indexed by the vector axis) is reused: a blocked conv's output channel
chunks, so each input value feeds two or three weight vectors (a blocked conv's tile is as square
as the row allows, ``_square_tile``: 4 x 4 rather than 8 x 2). The reduction runs inside the tile
with the accumulators in a local buffer, and everything outside the tile is fused into one
parallel loop, rows first where a conv's input outweighs its weights and output
(``_input_dominates``: each thread then reads part of the input, not all of it; such a conv pads
its input per tile, ``_pad_per_tile``), output channels first otherwise; a conv whose tile's
weights outgrow L1 (a pointwise one over many channels too) instead reduces in chunks, each
parallel iteration running a block of rows' tiles per chunk (``_chunked_rows``), and a large
matrix-vector product (a classifier) sums its rows in parallel parts
(``_matrix_vector_in_parts``). Elementwise epilogues (bias, ReLU) are computed right after their
tile while it is hot. A kernel of another shape is not this rule's: it answers None and the next
rule (``Basic``) takes it.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import SBlockInfo, normalize_prim_func

from relaxc.schedules.cpu.rule import CpuRule
from relaxc.schedules.cpu.steps import (L1_BYTES, L2_BYTES, MIN_PARALLEL_ROWS, broadcasts, buffer_bytes, index_names,
                                        inline_elementwise, largest_factor, loop_extent, schedule_spatial, try_attach,
                                        vector_width, vectorize_innermost)
from relaxc.support.targets import VectorUnit, accumulators
from relaxc.support.tvm_internals import UncheckedSchedule

MAX_TILE = 8  # register tile along the output row: 8 accumulators + 1 weight vector
MIN_ACCUMULATORS = 4  # fewer cannot hide the FMA latency
MAX_WHOLE_ROW = 14  # a short row with no good factor (13) is tiled whole: 13 accumulators still fit
LONG_REDUCTION = 1024  # a pointwise conv reducing over this many channels or more reduces in chunks
CHUNK_BYTES = 16 * 1024  # a chunk's weights for a tile's output channels (128 channels of a pointwise conv's 2 blocks)
MIN_TILES_PER_CHUNK = 4  # register tiles each chunk's weights serve, at least
LARGE_MATRIX = 1 << 18  # elements: a matrix-vector product this large streams its rows in parts
MATRIX_PARTS = (8, 4, 2)  # parts of the rows, the most that divide them
ROW_UNROLL = 4  # matrix rows per accumulator update in a part
MAX_PADDED_GROUPS = 2  # a rows-first conv pads its input per tile for at most this many tiles of output channels


def _tile(extent: int | None, limit: int = MAX_TILE) -> int:
    """Largest factor of ``extent`` up to ``limit`` (1 if none): a tile with no tail loop."""
    return largest_factor(extent, limit)


def _second_tile(sch: s_tir.Schedule, axes: list[s_tir.schedule.LoopRV], reuse: list[bool], tile: int,
                 budget: int) -> tuple[int, int] | None:
    """(axis index, factor) of a second register-tile axis, the tile staying within ``budget``
    accumulators; ``reuse[i]``: whether the broadcast operand is reused along ``axes[i]``.

    Such an axis is tiled whenever the budget allows: AVX-512's 32 registers hold 8 x 2 or 7 x 3
    accumulators where AVX2's 16 hold 8 x 1, and each broadcast then feeds two or three FMAs
    (ResNet-18's 3x3 convs, 2 cores: 8 x 1 -> 8 x 2 15-40 % faster, 7 x 2 on the 7- and 28-wide
    maps 30-40 %; 8 x 4 or a tail loop where the factor does not divide were slower).
    Otherwise only when ``tile`` alone is too small: a 111-wide output (SqueezeNet's stem) has no
    factor between 4 and 8; tiling another spatial axis too (output channel blocks) restores 4 or
    more. A matrix-vector product tiles the vectorised axis itself: adjacent vectors, so each
    weight row is read in long contiguous runs. Adjacent vectors are the tile's inner loop but one,
    inside its rows: each broadcast value then feeds them in turn and dies. Outside the rows, a
    batched matmul's 6 x 2 tile on AVX2 kept six broadcasts live beside its 12 accumulators and
    spilled (Whisper's attention products, 1500 x 1500 x 64: 25.3 -> 14.1 ms and 17.2 -> 12.2 ms).
    """
    innermost_first = range(len(axes) - 1, -1, -1)
    for index in (i for i in innermost_first if reuse[i]):
        factor = _tile(loop_extent(sch, axes[index]), budget // tile)
        if factor > 1:
            return index, factor
    if tile >= MIN_ACCUMULATORS:
        return None
    for index in innermost_first:
        factor = _tile(loop_extent(sch, axes[index]), budget // tile)
        if factor * tile >= MIN_ACCUMULATORS:
            return index, factor
    return None


def _square_tile(row: int | None, channels: int | None, budget: int) -> tuple[int, int] | None:
    """(columns, output channel blocks) of a blocked conv's register tile with the fewest loads
    per FMA, (c + k) / (c * k), within ``budget`` accumulators (the larger tile on a tie); None
    if ``row`` has no factor from ``MIN_ACCUMULATORS`` to ``MAX_TILE``.

    The row tile first (8 x 2 on a 56-wide map) loads 10 vectors for 16 FMAs and reads the input
    once per two channel blocks; 4 x 4 loads 8 and reads it once per four. On AVX-512 (2 cores, in
    the model) ResNet-50's three 64 -> 256 convs at 56 x 56 take 1.58 ms per inference instead of
    1.73, the 64 -> 64 one 0.11 instead of 0.17, and its stride-2 128-channel 3x3 conv (28-wide
    output, rows first) 0.10-0.13 ms less; the 14- and 7-wide maps keep 7 x 2. AVX2's 12
    accumulators hold no two row tiles, but 4 x 2 on the 56- and 28-wide maps (6 loads per 8 FMAs;
    the row tile 8 x 1 loads 9): ResNet-50 with the default schedules 37.4 ms instead of 40.2; there
    the 14- and 7-wide maps keep the row tile in the plain order (7 x 1 rows first lost 0.1-0.3 ms
    per conv)."""
    if row is None or channels is None:
        return None
    tiles = [(c, k) for c in range(MIN_ACCUMULATORS, MAX_TILE + 1) for k in range(1, channels + 1)
             if row % c == 0 and channels % k == 0 and c * k <= budget]
    return min(tiles, key=lambda t: ((t[0] + t[1]) / (t[0] * t[1]), -t[0] * t[1]), default=None)


def _broadcast_reads(info: SBlockInfo, sch: s_tir.Schedule) -> tuple[list[tirx.Var | None], list[set[str]]]:
    """A (spatial-then-reduction) block's spatial loop variables, and the index variables of each
    read that the vectorised (last spatial) loop does not index: the reads broadcast to a vector."""
    n_spatial = info.dom_kind().index("R")
    loop_var = {sch.get(it.loop_rv): it.var for it in info.iters}
    variables = [loop_var.get(sch.get(loop)) for loop in sch.get_loops(info.block_rv)[:n_spatial]]
    indexed = [index_names(read) for read in sch.get(info.block_rv).reads]
    return variables, [names for names in indexed if variables[-1] is None or variables[-1].name not in names]


def _broadcast_reuse(info: SBlockInfo, sch: s_tir.Schedule) -> list[bool]:
    """Per spatial loop, whether a broadcast read is not indexed by it: a tile along it reuses
    the broadcast."""
    variables, broadcast = _broadcast_reads(info, sch)
    return [var is not None and any(var.name not in names for names in broadcast) for var in variables]


def _operand_bytes(info: SBlockInfo, sch: s_tir.Schedule) -> tuple[int, int, int]:
    """Bytes of the block's reads broadcast to a vector (a conv's input), of its other reads (the
    weights) and of its writes. Call before the loops are split."""
    variables, _ = _broadcast_reads(info, sch)
    vector = variables[-1].name if variables[-1] is not None else None
    block = sch.get(info.block_rv)
    broadcast, other = 0, 0
    for read in block.reads:
        if any(read.source.same_as(w.source) for w in block.writes):
            continue  # the accumulator
        if vector is not None and vector not in index_names(read):
            broadcast += buffer_bytes(read.source)
        else:
            other += buffer_bytes(read.source)
    return broadcast, other, sum(buffer_bytes(w.source) for w in block.writes)


def _input_dominates(input_bytes: int, weight_bytes: int, output_bytes: int) -> bool:
    """Whether the reads broadcast to a vector (a conv's input) hold more bytes than the other reads
    and the output together (its weights and result; ``_operand_bytes``).

    Such a conv runs its parallel loop rows first: with output channels first each of the 2 threads
    reads the whole input. Rows first, ResNet-50's kernels sum 0.74-1.19 ms per inference less in
    the model (its three 512 -> 128 convs at 28 x 28: 0.34-0.44 ms of it)."""
    return input_bytes > weight_bytes + output_bytes


def _inline_lane_padding(sch: s_tir.Schedule, blocks: list[SBlockInfo], lanes: int) -> list[SBlockInfo]:
    """Inline padding read only by reductions without a broadcast read (depthwise convs: every
    read is a vector of channels, one FMA per load). A padding stage copies the whole input once
    more, which costs about as much as such a conv itself: EfficientNet-B0's 3x3 stride-2 depthwise
    conv on 96 x 112 x 112 took 0.70 ms with it, 0.31 ms with the bounds tested in its loads. A
    conv that reduces over input channels reads each input value into many FMAs: the stage is
    cheap there and tested loads were 2x slower (ResNet-18's 3x3 convs)."""
    reductions = {b.name: b for b in blocks if b.is_reduction()}  # all spatial-then-reduction (checked)
    for pad in [b for b in blocks if b.is_data_pad(sch) and _row_padding(sch, b, lanes) is None]:
        consumers = [reductions.get(sch.get(c).name_hint) for c in sch.get_consumers(pad.block_rv)]
        if consumers and all(c is not None and not _broadcast_reads(c, sch)[1] for c in consumers):
            sch.compute_inline(pad.block_rv)
            blocks = [b for b in blocks if b is not pad]
    return blocks


MAX_ROW_VECTOR = 8  # vectors in a padded row's middle, made one long vector (a partitioned loop cannot be split)


def _row_padding(sch: s_tir.Schedule, pad: SBlockInfo, lanes: int) -> tuple[int, int] | None:
    """For a padding stage that pads the innermost axis (a pool over NCHW pads W, the axis vectors run
    along) of rows short enough to copy as one vector each: the padding before a row and the row's
    width; else None."""
    block = sch.get(pad.block_rv)
    source, padded, inner = block.reads[0].source, block.writes[0].source, block.iter_vars[-1].var
    start = block.reads[0].region[-1].min  # the innermost index read: the written one less the padding before
    offset = start.b if isinstance(start, (tirx.Add, tirx.Sub)) and start.a.same_as(inner) else None
    before = (-1 if isinstance(start, tirx.Add) else 1) * int(offset) if isinstance(offset, tirx.IntImm) else -1
    width, loops = int(source.shape[-1]), sch.get_loops(pad.block_rv)
    if int(padded.shape[-1]) == width or before < 0 or width > MAX_ROW_VECTOR * lanes or len(loops) < 2 \
            or None in [loop_extent(sch, loop) for loop in loops]:
        return None
    return before, width


def schedule_padding(sch: s_tir.Schedule, pad: SBlockInfo, lanes: int) -> None:
    """A padding stage in parallel vectors; one of ``_row_padding``'s runs rows in parallel, each in
    three parts, the padding before, the copied middle as one vector, the padding after, so the
    middle tests no bound that differs between its lanes (a vector across a padded row scalarised
    the whole copy; inlined into a pool, the pool too: PoolFormer's 3x3 average pools ran at 2 % of
    their roofline, 2.2 ms where 0.24 ms is its time now)."""
    row = _row_padding(sch, pad, lanes)
    if row is None:
        schedule_spatial(sch, pad.block_rv, lanes)
        return
    before, width = row
    loops = sch.get_loops(pad.block_rv)
    sch.parallel(sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0])
    sch.vectorize(sch.loop_partition(loops[-1], [before, width, None])[1])  # LLVM splits it into vectors


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
    (of ``pads``) per tile where that pays (``_pad_per_tile``); returns the parallel loop its
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
    reuse = _broadcast_reuse(info, sch) if width > 1 else [False] * n_spatial
    input_bytes, weight_bytes, output_bytes = _operand_bytes(info, sch)
    rows_first = width > 1 and n_spatial == 4 and _input_dominates(input_bytes, weight_bytes, output_bytes)
    vec_outer, vec_inner = sch.split(spatial[-1], factors=[None, width])
    budget = accumulators(unit.registers)
    square = None
    if n_spatial >= 2:
        row = loop_extent(sch, spatial[-2])
        tile = _tile(row)
        if tile < MIN_ACCUMULATORS and row is not None and row <= MAX_WHOLE_ROW:
            tile = row
        if reuse[0] and (n_spatial == 4 or n_spatial == 3 and _is_blocked_conv(sch, block)):  # a blocked conv (1-D: H = 1 gone)
            square = _square_tile(row, loop_extent(sch, spatial[0]), budget)
            if square is not None and square[1] == 1 and budget // tile < 2:
                square = None  # AVX2 on a 14- or 7-wide map: the row tile in the plain order
            tile = square[0] if square is not None else tile
        tile_outer, tile_inner = sch.split(spatial[-2], factors=[None, tile])
        outer = list(spatial[:-2]) + [tile_outer, vec_outer]
        inner = [tile_inner, vec_inner]
    else:
        tile = 1
        outer, inner = [vec_outer], [vec_inner]
    second = (0, square[1]) if square is not None else _second_tile(sch, outer, reuse, tile, budget)
    if second is not None:
        index, factor = second
        outer[index], second_inner = sch.split(outer[index], factors=[None, factor])
        inner.insert(len(inner) - 1 if index == len(outer) - 1 else 0, second_inner)  # adjacent vectors: per row
    chunked = _chunked_rows(sch, outer, reduction, second, width * _bytes_per(info, sch), input_bytes, weight_bytes)
    if chunked is None:
        rows_outermost = rows_first and square is not None
        if rows_outermost:  # each thread reads part of the input, all the weights
            outer = [outer[1], outer[2], outer[0], outer[3]]
        sch.reorder(*outer, *reduction, *inner)
        if rows_outermost and (loop_extent(sch, outer[2]) or 0) <= MAX_PADDED_GROUPS:
            _pad_per_tile(sch, block, reduction[0], lanes, pads)
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


def _pad_per_tile(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loop: s_tir.schedule.LoopRV,
                  lanes: int, pads: list[SBlockInfo]) -> None:
    """Compute the padding stages (of ``pads``) that ``block``, a rows-first conv, reads under
    ``loop`` (its input channel blocks), into a local buffer of the rows and columns the tile reads,
    instead of a padded copy of the whole input first (as the Winograd input transform pads per
    tile): the tile's input goes to L1 once, where the copy wrote the padded input (1.7 MB) and read
    it back. ResNet-50's stride-2 3x3 conv from 56 x 56 x 128, its only such conv, runs 0.07-0.16 ms
    per inference faster in the model. Convs that reduce in chunks (0.05-0.15 ms slower with it) and
    the RGB stem (0.08-0.14) keep the copy, and so do convs whose output channels take more than
    ``MAX_PADDED_GROUPS`` tiles, each of which pads the same input again: on AVX2, MobileNetV4's
    stride-2 32 -> 96 conv (four tiles of 3 channel blocks) took 0.56 ms padding per tile, 0.36
    with the copy, ResNet-50's (eight tiles) 1.86 and 1.77, HRNet's stem conv 1.60 and 1.49."""
    producers = {sch.get(p).name_hint for p in sch.get_producers(block)}
    for pad in (p.block_rv for p in pads if p.name in producers):
        sch.compute_at(pad, loop, preserve_unit_loops=True)
        sch.set_scope(pad, 0, "local")
        vectorize_innermost(sch, pad, lanes)


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


def _bytes_per(info: SBlockInfo, sch: s_tir.Schedule) -> int:
    return sch.get(info.block_rv).writes[0].source.dtype.bits // 8


def _chunked_rows(sch: s_tir.Schedule, outer: list[s_tir.schedule.LoopRV], reduction: list[s_tir.schedule.LoopRV],
                  second: tuple[int, int] | None, vector_bytes: int, input_bytes: int, weight_bytes: int
                  ) -> tuple[list[s_tir.schedule.LoopRV], s_tir.schedule.LoopRV, list[s_tir.schedule.LoopRV]] | None:
    """For a blocked conv whose register tile spans several output channel blocks (``second``:
    AVX-512's registers; AVX2's on 56- and 28-wide maps only) and whose tile's
    weights over the whole reduction (``vector_bytes`` each vector) exceed ``L1_BYTES`` while those
    of one input channel block fit, the weights outweighing the input, or a pointwise conv over
    ``LONG_REDUCTION`` channels or more: each parallel iteration takes a block of rows for
    its output channels and reduces over the input channel blocks in chunks of ``CHUNK_BYTES`` of
    the tile's weights, every tile of the rows in turn per chunk, the accumulators in a local buffer
    of the rows. Returns the loops to fuse into the parallel loop, the chunk loop and the loops
    inside it in order; None for any other kernel (``outer``: output channel blocks, rows, columns,
    vectors).

    Tile by tile over the whole reduction, each tile reads its input as one short run per channel
    block (64 runs of 448 bytes for 1024 channels), which the prefetchers do not follow, and its
    weights from L2 for one row of outputs; in chunks, each chunk's input for the rows is one run per
    block and its weights stay in L1: ResNet-50's five 1024 -> 256 convs at 14 x 14 take 1.94-2.59
    ms per inference in the model instead of 2.17-3.34. A 3x3 conv's chunk is one block of 16
    channels (2 x 16 x 9 weight vectors, 18 KB): ResNet-50's stride-2 512-channel 3x3 conv to 7 x 7
    runs 0.17-0.23 ms faster, ResNet-18's 512-channel 3x3 convs at 7 x 7 0.13-0.24. The conditions
    leave out what lost: a conv whose input dominates (the stride-2 3x3 conv to 28 x 28, 1.19 ->
    1.29 ms), one whose tile's weights per block do not fit in L1 anyway (ZFNet's 5x5 96 -> 256
    conv, 100 KB per block: 0.15-0.21 ms), and a shorter reduction (the 128 -> 512 conv at 28 x 28:
    0.54 ms tile by tile, 1.0 ms in one chunk, the accumulators of whole rows going through memory).
    A tile of one output channel block (AVX2 on 14- and 7-wide maps) reduces in chunks only where
    its weights over the reduction and the input together outgrow ``L2_BYTES``: HRNet's stride-2 3x3
    512 -> 1024 conv (147 KB of weights a tile, 400 KB of input) 5.1 -> 4.3 ms on Zen 3; a 256 -> 512
    one (73 KB) and long pointwise convs gained nothing in chunks."""
    extents = [loop_extent(sch, loop) for loop in reduction]
    if len(outer) != 4 or len(reduction) < 2 or None in extents or second is not None and second[0] != 0:
        return None
    blocks = second[1] if second is not None else 1  # output channel blocks in the tile
    block_bytes = blocks * math.prod(extents[1:]) * vector_bytes  # a tile's weights per input channel block
    long_pointwise = len(reduction) == 2 and math.prod(extents) >= LONG_REDUCTION
    weights_chunk = weight_bytes > input_bytes and block_bytes <= L1_BYTES < block_bytes * extents[0]
    if second is None:  # a tile of one block: only where its weights and the input outgrow L2
        wanted = weights_chunk and not long_pointwise and block_bytes * extents[0] + input_bytes > L2_BYTES
    else:
        wanted = weights_chunk or long_pointwise
    if not wanted:
        return None
    channels, rows, columns, vectors = outer
    height, groups = loop_extent(sch, rows), loop_extent(sch, channels)
    if height is None or groups is None:
        return None
    block = next((r for r in range(height, 0, -1) if height % r == 0 and groups * (height // r) >= MIN_PARALLEL_ROWS), 1)
    if block * (loop_extent(sch, columns) or 1) < MIN_TILES_PER_CHUNK:
        return None  # a chunk's weights would serve one or two tiles: the 2048 -> 512 conv in rows of one, 0.78 ms
    chunk = _tile(extents[0], max(1, CHUNK_BYTES // block_bytes))
    row_outer, row_inner = sch.split(rows, factors=[None, block])
    chunk_outer, chunk_inner = sch.split(reduction[0], factors=[None, chunk])
    return [channels, row_outer], chunk_outer, [row_inner, columns, vectors, chunk_inner, *reduction[1:]]


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
    blocks = _inline_lane_padding(sch, blocks, lanes)
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
