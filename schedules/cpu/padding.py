"""Padding stages of the ``Tiled`` and ``Int8`` rules' convolutions and pools: inlined into a
depthwise conv (``inline_lane_padding``), copied in parallel vectors, a short padded row in three
parts (``schedule_padding``), or computed per register tile of a rows-first conv (``pad_per_tile``).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import SBlockInfo

from relaxc.schedules.cpu.steps import loop_extent, schedule_spatial, vectorize_innermost
from relaxc.schedules.cpu.tile_plan import broadcast_reads
from relaxc.support.errors import DoesNotFit

MAX_PADDED_GROUPS = 2  # a rows-first conv pads its input per tile for at most this many tiles of output channels
MAX_ROW_VECTOR = 8  # vectors in a padded row's middle, made one long vector (a partitioned loop cannot be split)


def inline_lane_padding(sch: s_tir.Schedule, blocks: list[SBlockInfo], lanes: int) -> list[SBlockInfo]:
    """Inline padding read only by reductions without a broadcast read (depthwise convs: every
    read is a vector of channels, one FMA per load). A padding stage copies the whole input once
    more, which costs about as much as such a conv itself: EfficientNet-B0's 3x3 stride-2 depthwise
    conv on 96 x 112 x 112 took 0.70 ms with it, 0.31 ms with the bounds tested in its loads. A
    conv that reduces over input channels reads each input value into many FMAs: the stage is
    cheap there and tested loads were 2x slower (ResNet-18's 3x3 convs)."""
    reductions = {b.name: b for b in blocks if b.is_reduction()}  # all spatial-then-reduction (checked)
    for pad in [b for b in blocks if b.is_data_pad(sch) and _row_padding(sch, b, lanes) is None]:
        consumers = [reductions.get(sch.get(c).name_hint) for c in sch.get_consumers(pad.block_rv)]
        if consumers and all(c is not None and not broadcast_reads(c, sch)[1] for c in consumers):
            sch.compute_inline(pad.block_rv)
            blocks = [b for b in blocks if b is not pad]
    return blocks


def _row_padding(sch: s_tir.Schedule, pad: SBlockInfo, lanes: int) -> tuple[int, int] | None:
    """For a padding stage that pads the innermost axis (a pool over NCHW pads W, the axis vectors run
    along) of rows short enough to copy as one vector each: the padding before a row and the row's
    width; else None."""
    block = sch.get(pad.block_rv)
    source, padded, inner = block.reads[0].source, block.writes[0].source, block.iter_vars[-1].var
    start = block.reads[0].region[-1].min  # the innermost index read: the written one less the padding before
    offset = start.b if isinstance(start, (tirx.Add, tirx.Sub)) and start.a.same_as(inner) else None
    before = (-1 if isinstance(start, tirx.Add) else 1) * int(offset) if isinstance(offset, tirx.IntImm) else -1
    if not all(isinstance(shape[-1], tirx.IntImm) for shape in (source.shape, padded.shape)):
        raise DoesNotFit("a padded row of dynamic width")  # the rules schedule none: such a kernel falls to Basic
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


def pad_per_tile(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loop: s_tir.schedule.LoopRV,
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
