"""The ``Winograd`` CPU rule: the input and output transforms of ``passes/winograd.py``.

Both transforms compute a whole tile of values from a whole tile of values (B^T d B, A^T M A) in
two stages: the tile's positions are unrolled, so each element's coefficient selection is resolved
at compile time, the first stage is computed per tile into a local buffer that LLVM keeps in
registers, and the channels are the vector. The input transform's loop nest runs tile by tile
(p, channel vector) writing its alpha^2 values; the output transform runs along output rows, each
m x m tile with its fused epilogue (bias, activation, residual add): it fuses as the convolution it
replaces (``passes/dispatch.py``), so no other transform shares its kernel. The product between
them is the ``Dense`` rule's.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func

from relaxc.passes.legalize import STAGE_ATTR
from relaxc.passes.winograd import INPUT_ATTR, OUTPUT_ATTR
from relaxc.schedules.cpu.rule import CpuRule, kernel_blocks
from relaxc.schedules.cpu.steps import inline_elementwise, loop_extent
from relaxc.support.targets import VectorUnit
from relaxc.support.tvm_internals import UncheckedSchedule


class Winograd(CpuRule):
    """Schedules kernels holding a Winograd input or output transform; None for any other."""

    def may_fit(self, func: tirx.PrimFunc) -> bool:
        return any(attr in block.annotations for block in kernel_blocks(func) for attr in (INPUT_ATTR, OUTPUT_ATTR))

    def schedule(self, func: tirx.PrimFunc, unit: VectorUnit) -> s_tir.Schedule | None:
        sch = UncheckedSchedule(func)
        blocks = normalize_prim_func(sch)
        if blocks is None:
            return None
        marked = {attr: b for b in blocks for attr in (INPUT_ATTR, OUTPUT_ATTR)
                  if attr in sch.get(b.block_rv).annotations}
        if INPUT_ATTR in marked:
            block = marked[INPUT_ATTR].block_rv
            _schedule_input(sch, block, _stage_of(sch, block), unit.lanes)
            return sch
        if OUTPUT_ATTR in marked:
            m = int(sch.get(marked[OUTPUT_ATTR].block_rv).annotations[OUTPUT_ATTR])
            remaining = inline_elementwise(sch, blocks)
            if len(remaining) != 2:  # the first stage and the output transform with its epilogue inlined
                return None
            _schedule_output(sch, remaining[-1].block_rv, _stage_of(sch, remaining[-1].block_rv), m, unit.lanes)
            return sch
        return None


def _stage_of(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> s_tir.schedule.SBlockRV:
    """The transform's first stage: the producer marked ``STAGE_ATTR``."""
    return next(b for b in sch.get_producers(block) if STAGE_ATTR in sch.get(b).annotations)


def _tile_stage(sch: s_tir.Schedule, stage: s_tir.schedule.SBlockRV, loop: s_tir.schedule.LoopRV,
                lanes: int) -> None:
    """The first stage computed under ``loop`` for one tile, into a local buffer, unrolled with its
    channels the vector: its constant indices let LLVM keep it in registers."""
    sch.compute_at(stage, loop)
    sch.set_scope(stage, 0, "local")
    _unroll_tile(sch, stage, loop, lanes)


def _unroll_tile(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loop: s_tir.schedule.LoopRV,
                 lanes: int) -> None:
    """The loops of ``block`` under ``loop`` unrolled, the innermost (channels) the vector."""
    loops = sch.get_loops(block)
    depth = next(i for i, each in enumerate(loops) if sch.get(each).same_as(sch.get(loop)))
    *tile, channels = loops[depth + 1:]
    for t in tile:
        sch.unroll(t)
    if loop_extent(sch, channels) in (lanes, lanes // 2):
        sch.vectorize(channels)


def _schedule_input(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, stage: s_tir.schedule.SBlockRV,
                    lanes: int) -> None:
    """Loops (t, p, c): per tile p and channel vector, all alpha^2 positions t unrolled."""
    t, p, c = sch.get_loops(block)
    width = lanes if (loop_extent(sch, c) or 0) % lanes == 0 else 1
    c_outer, c_inner = sch.split(c, factors=[None, width])
    sch.reorder(p, c_outer, t, c_inner)
    tile = sch.fuse(p, c_outer)
    sch.parallel(tile)
    sch.unroll(t)
    sch.vectorize(c_inner)
    _tile_stage(sch, stage, tile, lanes)
    _pad_per_tile(sch, stage, tile, lanes)


def _pad_per_tile(sch: s_tir.Schedule, stage: s_tir.schedule.SBlockRV, loop: s_tir.schedule.LoopRV,
                  lanes: int) -> None:
    """The tile's input copied under ``loop`` into a local buffer with the padding (and a producer
    fused before it) computed in the copy, instead of a padded copy of the whole input first.
    ResNet-50's four input transforms take 0.74-0.79 ms per inference in the model instead of
    1.04-1.08 (tuning off). With the caches flushed some shapes run slower this way (the 128-channel
    28x28 one 2x): where a store holds a record of the whole-input copy, the selection measures both."""
    pad = sch.get_producers(stage)[0]
    for producer in sch.get_producers(pad):  # one that cannot be inlined: the kernel is not this rule's
        sch.compute_inline(producer)
    tile_input = sch.cache_read(stage, 0, "local")
    sch.compute_at(tile_input, loop)
    sch.compute_inline(pad)
    _unroll_tile(sch, tile_input, loop, lanes)


def _schedule_output(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, stage: s_tir.schedule.SBlockRV,
                     m: int, lanes: int) -> None:
    """Loops ([n,] o, y, x, i): split into m x m tiles, the tile unrolled, the channel block the vector;
    the first stage per tile."""
    *outer, y, x, i = sch.get_loops(block)  # a batch of 1 has no loop
    y_outer, y_inner = sch.split(y, factors=[None, m])
    x_outer, x_inner = sch.split(x, factors=[None, m])
    sch.reorder(*outer, y_outer, x_outer, y_inner, x_inner, i)
    sch.parallel(sch.fuse(*outer, y_outer))
    sch.unroll(y_inner)
    sch.unroll(x_inner)
    if loop_extent(sch, i) in (lanes, lanes // 2):
        sch.vectorize(i)
    _tile_stage(sch, stage, x_outer, lanes)
