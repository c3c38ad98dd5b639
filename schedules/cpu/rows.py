"""The ``Rows`` CPU rule: kernels that reduce each row of a tensor over its last axis and use the
result on that row (softmax, LayerNorm, RMSNorm, mean and variance over the last axis), fused with
their elementwise neighbours and the attention mask.

Every block is computed inside one parallel loop over the rows, so a row is read from memory once
and its max, sums and normalised values are made while it is in L1 (the ``Tiled`` rule parallelised
each block on its own and vectorised along the rows, which are not contiguous: scalar code, and each
stage streamed the whole tensor again). Along the row, loops run in whole vectors, then the rest
(ViT's 197 tokens: 12 vectors and 5 elements). The reductions themselves run in ``lanes`` partial
results, one vector, when the row divides into vectors (rfactor), so a sum or max is not one long
chain of dependent scalar operations; a softmax's rows that do not divide arrive padded to whole
vectors from legalisation (``passes/legalize.softmax_padded_rows``). Kernels of any other shape
answer None.

A row may also span several axes that are not innermost in memory: a LayerNorm over the channels
of blocked NCHW{b}c data (ConvNeXt's) reduces over the channel blocks and their lanes at each
pixel. Its partial results are the lanes themselves (one vector added per channel block), and the
output loops over the pixels outside and over the row's axes inside (the ``Tiled`` rule vectorised
such a kernel along the row of pixels, 16 floats apart: ConvNeXt-T's took 22 ms).

A reduction over a middle axis (a softmax over the channels of NCHW, or over the keys of an
attention map laid out (heads, keys, queries); a max or a mean over one such axis) runs in columns
(``_columns``): slabs in parallel, and within a slab the reduced axis outside the innermost axis,
which runs in vectors. As rows along the strided axis, a softmax over the keys of an (8, 196, 196)
map took 50 ms; in columns 0.23 ms, as onnxruntime.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import SBlockInfo, normalize_prim_func

from relaxc.schedules.cpu.rule import CpuRule, kernel_blocks
from relaxc.schedules.cpu.steps import loop_extent, points, range_names, schedule_spatial, vectorize_innermost
from relaxc.support.errors import DoesNotFit, message
from relaxc.support.targets import VectorUnit
from relaxc.support.tvm_internals import UncheckedSchedule


def _row_reduction(sch: s_tir.Schedule, info: SBlockInfo) -> bool:
    """Spatial loops then reduction loops whose innermost alone indexes the innermost (contiguous)
    axis of what it reads: a row (several loops: a blocked LayerNorm's lanes; not a pool's window,
    which moves with the output position, nor a softmax over a middle axis: ``_column_reduction``)."""
    kinds = info.dom_kind()
    spatial = kinds.rstrip("R")
    if not (1 <= len(spatial) < len(kinds) and set(spatial) == {"S"}):
        return False
    block = sch.get(info.block_rv)
    reduced = {v.var.name for v in block.iter_vars if v.iter_type == tirx.IterVar.CommReduce}
    innermost = block.iter_vars[-1].var.name

    spatial = {v.var.name for v in block.iter_vars if v.iter_type == tirx.IterVar.DataPar}
    reads = [read for read in block.reads if any(range_names(r) & reduced for r in read.region)]
    return bool(reads) and all(innermost in range_names(read.region[-1]) and not range_names(read.region[-1]) & spatial
                               for read in reads)


def _column_reduction(sch: s_tir.Schedule, info: SBlockInfo) -> str | None:
    """For spatial loops then one reduction loop over a middle axis (a softmax or a max over the
    channels of NCHW, or over a row of an attention map laid out (heads, keys, queries)), whose reads
    run along memory with the last spatial iterator: that iterator's name (the column); else None."""
    kinds = info.dom_kind()
    if len(kinds) < 3 or kinds[:-1] != "S" * (len(kinds) - 1) or kinds[-1] != "R":
        return None
    block = sch.get(info.block_rv)
    reduced, column = block.iter_vars[-1].var.name, block.iter_vars[-2].var.name

    reads = [read for read in block.reads if any(reduced in range_names(r) for r in read.region)]
    good = reads and all(range_names(read.region[-1]) == {column} and reduced not in range_names(read.region[-1])
                         for read in reads)
    return column if good else None


def product_operands(block: s_tir.SBlock) -> tuple[tvm.ir.TensorLoad, tvm.ir.TensorLoad] | None:
    """The two tensor elements the block sums products of (widening casts looked through: 8-bit
    products summed in int32), if it is a matmul or a conv, which the other rules tile; None for
    other blocks, a sum of squares (RMSNorm) among them."""
    body = block.body
    value = body.value if isinstance(body, tirx.BufferStore) else None
    product = value.b if isinstance(value, tirx.Add) and isinstance(value.b, tirx.Mul) else None
    if product is None:
        return None
    a, b = (f.value if isinstance(f, tirx.Cast) else f for f in (product.a, product.b))
    if all(isinstance(f, tvm.ir.TensorLoad) for f in (a, b)) and not tvm_ffi.structural_equal(a, b):
        return a, b
    return None


class Rows(CpuRule):
    """Row-parallel reductions over the last axis with their elementwise neighbours; reductions over
    a middle axis in columns (``_columns``)."""

    def may_fit(self, func: tirx.PrimFunc) -> bool:
        return any(v.iter_type == tirx.IterVar.CommReduce for block in kernel_blocks(func) for v in block.iter_vars)

    def schedule(self, func: tirx.PrimFunc, unit: VectorUnit) -> s_tir.Schedule | None:
        return _rows(func, unit.lanes)


def _rows(func: tirx.PrimFunc, lanes: int) -> s_tir.Schedule | None:
    sch = UncheckedSchedule(func)
    blocks = normalize_prim_func(sch)
    if blocks is None:
        return None
    reductions = [b for b in blocks if b.is_reduction()]
    if not reductions or any(product_operands(sch.get(b.block_rv)) is not None for b in reductions):
        return None
    if all(_column_reduction(sch, b) for b in reductions):
        return _columns(sch, blocks, lanes)
    if all(_whole_reduction(sch, b) for b in reductions):
        return _whole(sch, blocks, lanes)
    if not all(_row_reduction(sch, b) for b in reductions):
        return None
    _inline_single_use(sch, blocks)
    partials = [_partial_sums(sch, b.block_rv, lanes) for b in reductions]  # before compute_at: rfactor needs root blocks
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    rows = _row_loops(sch, blocks[-1], reductions)
    if rows is None:
        return None
    row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    sch.parallel(row)
    for block in reversed(blocks[:-1]):
        sch.compute_at(block, row, preserve_unit_loops=True)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if not any(v.iter_type == tirx.IterVar.CommReduce for v in sch.get(block).iter_vars) \
                and not sch.get(sch.get_loops(block)[-1]).same_as(sch.get(row)):
            _vectorize_row(sch, block, lanes)
    for partial in filter(None, partials):
        _vectorize_partial(sch, partial)
    return sch


def _whole_reduction(sch: s_tir.Schedule, info: SBlockInfo) -> bool:
    """A reduction to one value (a mean or a variance over every axis: GroupNorm of one group)."""
    loops = sch.get_loops(info.block_rv)
    return all(kind == "R" or loop_extent(sch, loop) == 1 for kind, loop in zip(info.dom_kind(), loops)) \
        and all(loop_extent(sch, loop) is not None for loop in loops)


def _whole(sch: s_tir.Schedule, blocks: list[SBlockInfo], lanes: int) -> s_tir.Schedule:
    """Reductions to one value, each in ``lanes`` partial results over its loops fused into one
    (rfactor: a vector add a step instead of one long chain of dependent scalar adds: PoolFormer's
    GroupNorm variances ran at 2 % of their roofline), and the elementwise rest in parallel vectors."""
    _inline_single_use(sch, blocks)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        loops = sch.get_loops(block)
        if not any(v.iter_type == tirx.IterVar.CommReduce for v in sch.get(block).iter_vars):
            schedule_spatial(sch, block, lanes)
            continue
        reduction = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        extent = loop_extent(sch, reduction) or 0
        if extent % lanes or extent == lanes:
            continue
        _, vector = sch.split(reduction, factors=[None, lanes])
        partial = sch.rfactor(vector, 0)
        chunk, lane = sch.get_loops(partial)
        sch.vectorize(lane)
        sch.decompose_reduction(partial, chunk)
    return sch


def _columns(sch: s_tir.Schedule, blocks: list[SBlockInfo], lanes: int) -> s_tir.Schedule | None:
    """Reductions over a middle axis, by slabs: every block inside one parallel loop over the axes
    outside the reduced one, and within it the reduced axis outside the innermost (contiguous) one,
    which runs in vectors: each step of a max or a sum takes a whole vector of columns (a softmax
    over the keys of an (8, 196, 196) attention map: 50 ms as rows along the strided axis, 0.94 ms
    as ``Tiled`` scheduled it)."""
    results = [sch.get(b.block_rv).writes[0].source for b in blocks if b.is_reduction()]
    _inline_single_use(sch, blocks)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    split = _slab_loops(sch, blocks[-1], results)
    if split is None:
        return None
    outer, inner = split
    sch.reorder(*outer, *inner)
    slab = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    sch.parallel(slab)
    for block in reversed(blocks[:-1]):
        sch.compute_at(block, slab, preserve_unit_loops=True)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        loops = sch.get_loops(block)[1:]
        if any(v.iter_type == tirx.IterVar.CommReduce for v in sch.get(block).iter_vars):
            column, reduced = loops[-2], loops[-1]
            sch.reorder(reduced, column)  # the reduced axis outside the column
            vectorize_innermost(sch, block, lanes)  # not partitioned: that would split the reduction's writes
            vectorize_innermost(sch, sch.decompose_reduction(block, reduced), lanes)  # its initialisation
        else:
            _vectorize_row(sch, block, lanes)
    return sch


def _slab_loops(sch: s_tir.Schedule, anchor: s_tir.schedule.SBlockRV,
                results: list[tirx.Buffer]) -> tuple[list, list] | None:
    """The anchor's loops over slabs, and the others (the reduced axis, if the anchor has it, then the
    column) in their order; None where they are not so. A reduction: its spatial loops but the column
    are the slabs'. An elementwise block: the loops indexing the reductions' results, but its
    innermost (the column)."""
    block = sch.get(anchor)
    loops = sch.get_loops(anchor)
    names = [v.var.name for v in block.iter_vars]
    if len(names) != len(loops) or len(loops) < 3:
        return None
    if block.iter_vars[-1].iter_type == tirx.IterVar.CommReduce:
        return loops[:-2], loops[-2:]
    used = {name for read in block.reads if any(read.source.same_as(r) for r in results)
            for region in read.region for name in range_names(region)}
    outer = [loop for loop, name in zip(loops[:-1], names[:-1]) if name in used]
    inner = [loop for loop, name in zip(loops, names) if name not in used or name == names[-1]]
    return (outer, inner) if outer and len(inner) <= 2 and names[-1] in used else None


def _vectorize_row(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, lanes: int) -> None:
    """Vectorise the block's loop along the row: a row longer than a vector that does not divide
    into vectors runs its whole vectors, then the rest (LLVM's vectoriser, given 1,500 columns,
    kept the 4-lane vectors that divide them: Whisper's softmax ran at half speed)."""
    loop = sch.get_loops(block)[-1]
    extent = loop_extent(sch, loop)
    if extent is None or extent <= lanes or extent % lanes == 0:
        vectorize_innermost(sch, block, lanes)  # where a width divides the row; else LLVM's vectoriser
        return
    whole, _ = sch.loop_partition(loop, [extent - extent % lanes, None])
    sch.vectorize(sch.split(whole, factors=[None, lanes])[1])


def _reduced_loop_vars(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> list[tirx.Var]:
    """The loop variables the block's reduction iterators are bound to (the iterators' order need not
    be the loops': rfactor's write-back block lists its reduced lane first)."""
    stmt, found = sch.get(block), []

    def visit(realize: s_tir.SBlockRealize) -> s_tir.SBlockRealize:
        if realize.block.same_as(stmt):
            for iv, value in zip(stmt.iter_vars, realize.iter_values):
                if iv.iter_type == tirx.IterVar.CommReduce:
                    found.extend(tirx.analysis.undefined_vars(value))
        return realize

    tvm_ffi.structural_map(sch.mod["main"].body, (s_tir.SBlockRealize, visit))
    return found


def _row_loops(sch: s_tir.Schedule, anchor: s_tir.schedule.SBlockRV,
               reductions: list[SBlockInfo]) -> list[s_tir.schedule.LoopRV] | None:
    """The anchor's loops over rows, moved outside its loops along a row (None if it has none of
    either). Rows of one axis: every loop but the last, or every loop of an anchor with one value a
    row (a variance over the pixels of (N, groups, pixels), InstanceNorm's and the GroupNorm exported
    through it: ``Tiled`` vectorised it across rows 25,088 floats apart, on one thread). Rows over
    several axes (a blocked LayerNorm reduces over channel blocks and lanes): a reduction's spatial
    loops, or for an elementwise anchor the loops whose variables index its reads of the reductions'
    results (the pixels)."""
    loops = sch.get_loops(anchor)
    block = sch.get(anchor)
    if any(v.iter_type == tirx.IterVar.CommReduce for v in block.iter_vars):  # a reduction is the last block
        reduced = _reduced_loop_vars(sch, anchor)
        spatial = [loop for loop in loops if all(not sch.get(loop).loop_var.same_as(v) for v in reduced)]
        return spatial if 0 < len(spatial) < len(loops) else None
    if loops and points(sch, anchor) == points(sch, reductions[0].block_rv):
        return loops  # one value a row (a variance, its square root): every loop is over rows
    if all(r.dom_kind().count("R") == 1 for r in reductions):
        return loops[:-1] if len(loops) >= 2 else None
    results = [sch.get(r.block_rv).writes[0].source for r in reductions]
    used: set[str] = set()
    for read in block.reads:
        if any(read.source.same_as(result) for result in results):
            used |= {v.name for region in read.region for v in tirx.analysis.undefined_vars(region.min)}
    outer = [loop for loop, v in zip(loops, block.iter_vars) if v.var.name in used]
    inner = [loop for loop, v in zip(loops, block.iter_vars) if v.var.name not in used]
    if not outer or not inner:
        return None
    sch.reorder(*outer, *inner)
    return outer


def _inline_single_use(sch: s_tir.Schedule, blocks: list[SBlockInfo]) -> None:
    """Inline elementwise blocks read by one block (a mask, a cast); a value two blocks read (the
    exponentials of a softmax, read by its sum and its normalisation) is computed once."""
    for info in blocks:
        if info.is_reduction() or len(sch.get_consumers(info.block_rv)) != 1:
            continue
        try:
            sch.compute_inline(info.block_rv)
        except s_tir.ScheduleError:  # TVM's own test of what inlines (a block writing its output does not)
            pass


def _partial_sums(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, lanes: int) -> s_tir.schedule.SBlockRV | None:
    """Split a reduction whose row divides into vectors into ``lanes`` partial results (rfactor):
    returns the block computing them, or None (the row stays one scalar chain)."""
    loops = sch.get_loops(block)
    reduced = sum(v.iter_type == tirx.IterVar.CommReduce for v in sch.get(block).iter_vars)
    inner, extent = loops[-1], loop_extent(sch, loops[-1])
    if extent == lanes and reduced > 1:  # a channel block's lanes: the partial results as they are
        return _rfactor(sch, inner)
    if extent is None or extent % lanes or extent == lanes:
        return None
    _, vector = sch.split(inner, factors=[None, lanes])
    return _rfactor(sch, vector)


def _rfactor(sch: s_tir.Schedule, loop: s_tir.schedule.LoopRV) -> s_tir.schedule.SBlockRV:
    """The block of ``loop``'s partial results. TVM's ``rfactor`` refuses a reduction whose
    combiner or initial value it does not recognise (a ``ScheduleError``), which only trying shows:
    then the kernel is not this rule's."""
    try:
        return sch.rfactor(loop, 0)
    except s_tir.ScheduleError as err:
        raise DoesNotFit(f"rfactor refuses the reduction: {message(err, last=True)}") from None


def _vectorize_partial(sch: s_tir.Schedule, partial: s_tir.schedule.SBlockRV) -> None:
    """The partial-sum block, moved into the row loop, has its loops in the order of its iterators:
    (the lane, the row's unit loops, the reduction); the lane goes innermost and is vectorised."""
    loops = sch.get_loops(partial)
    sch.reorder(loops[-1], loops[1])
    loops = sch.get_loops(partial)
    sch.vectorize(loops[-1])
    sch.decompose_reduction(partial, loops[1])
    chunks = loop_extent(sch, loops[1])
    if _reads_padded_row(sch.get(partial)) and chunks and chunks > 1:  # the last vector alone reads past the row
        sch.loop_partition(loops[1], [chunks - 1, None])


def _reads_padded_row(block: s_tir.SBlock) -> bool:
    """Whether a reduction reads its row padded to whole vectors (``passes/legalize.softmax_padded_rows``:
    the identity past the row's end, through a clamped index); whole vectors before the last then
    load plainly, once the last is a loop of its own."""
    value = block.body.value if isinstance(block.body, tirx.BufferStore) else None
    return value is not None and isinstance(getattr(value, "b", None), tirx.Select)
