"""The register tile of the ``Tiled`` rule (``schedules/cpu/tiled.py``): its shape and what decides it.

The innermost spatial axis is vectorised and the next one tiled (``tile_factor``); where the target
has registers to spare, a second axis along which the broadcast operand (the read the vector axis
does not index, a conv's input) is reused is tiled too (``second_tile``), and a blocked conv's tile
is as square as its row allows (``square_tile``). The operands' sizes (``operand_bytes``) decide
whether a conv runs rows first (``input_dominates``) and whether it reduces in chunks of L1-sized
weights (``chunked_rows``).
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import SBlockInfo

from relaxc.schedules.cpu.steps import (L1_BYTES, L2_BYTES, MIN_PARALLEL_ROWS, buffer_bytes, index_names,
                                        largest_factor, loop_extent)

MAX_TILE = 8  # register tile along the output row: 8 accumulators + 1 weight vector
MIN_ACCUMULATORS = 4  # fewer cannot hide the FMA latency
MAX_WHOLE_ROW = 14  # a short row with no good factor (13) is tiled whole: 13 accumulators still fit
LONG_REDUCTION = 1024  # a pointwise conv reducing over this many channels or more reduces in chunks
CHUNK_BYTES = 16 * 1024  # a chunk's weights for a tile's output channels (128 channels of a pointwise conv's 2 blocks)
MIN_TILES_PER_CHUNK = 4  # register tiles each chunk's weights serve, at least


def tile_factor(extent: int | None, limit: int = MAX_TILE) -> int:
    """Largest factor of ``extent`` up to ``limit`` (1 if none): a tile with no tail loop."""
    return largest_factor(extent, limit)


def second_tile(sch: s_tir.Schedule, axes: list[s_tir.schedule.LoopRV], reuse: list[bool], tile: int,
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
        factor = tile_factor(loop_extent(sch, axes[index]), budget // tile)
        if factor > 1:
            return index, factor
    if tile >= MIN_ACCUMULATORS:
        return None
    for index in innermost_first:
        factor = tile_factor(loop_extent(sch, axes[index]), budget // tile)
        if factor * tile >= MIN_ACCUMULATORS:
            return index, factor
    return None


def square_tile(row: int | None, channels: int | None, budget: int) -> tuple[int, int] | None:
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


def broadcast_reads(info: SBlockInfo, sch: s_tir.Schedule) -> tuple[list[tirx.Var | None], list[set[str]]]:
    """A (spatial-then-reduction) block's spatial loop variables, and the index variables of each
    read that the vectorised (last spatial) loop does not index: the reads broadcast to a vector."""
    n_spatial = info.dom_kind().index("R")
    loop_var = {sch.get(it.loop_rv): it.var for it in info.iters}
    variables = [loop_var.get(sch.get(loop)) for loop in sch.get_loops(info.block_rv)[:n_spatial]]
    indexed = [index_names(read) for read in sch.get(info.block_rv).reads]
    return variables, [names for names in indexed if variables[-1] is None or variables[-1].name not in names]


def broadcast_reuse(info: SBlockInfo, sch: s_tir.Schedule) -> list[bool]:
    """Per spatial loop, whether a broadcast read is not indexed by it: a tile along it reuses
    the broadcast."""
    variables, broadcast = broadcast_reads(info, sch)
    return [var is not None and any(var.name not in names for names in broadcast) for var in variables]


def operand_bytes(info: SBlockInfo, sch: s_tir.Schedule) -> tuple[int, int, int]:
    """Bytes of the block's reads broadcast to a vector (a conv's input), of its other reads (the
    weights) and of its writes. Call before the loops are split."""
    variables, _ = broadcast_reads(info, sch)
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


def input_dominates(input_bytes: int, weight_bytes: int, output_bytes: int) -> bool:
    """Whether the reads broadcast to a vector (a conv's input) hold more bytes than the other reads
    and the output together (its weights and result; ``operand_bytes``).

    Such a conv runs its parallel loop rows first: with output channels first each of the 2 threads
    reads the whole input. Rows first, ResNet-50's kernels sum 0.74-1.19 ms per inference less in
    the model (its three 512 -> 128 convs at 28 x 28: 0.34-0.44 ms of it)."""
    return input_bytes > weight_bytes + output_bytes


def bytes_per(info: SBlockInfo, sch: s_tir.Schedule) -> int:
    return sch.get(info.block_rv).writes[0].source.dtype.bits // 8


def chunked_rows(sch: s_tir.Schedule, outer: list[s_tir.schedule.LoopRV], reduction: list[s_tir.schedule.LoopRV],
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
    chunk = tile_factor(extents[0], max(1, CHUNK_BYTES // block_bytes))
    row_outer, row_inner = sch.split(rows, factors=[None, block])
    chunk_outer, chunk_inner = sch.split(reduction[0], factors=[None, chunk])
    return [channels, row_outer], chunk_outer, [row_inner, columns, vectors, chunk_inner, *reduction[1:]]
