"""Schedule steps every CPU rule takes: loop extents, vectorising the innermost loop, spatial
kernels in one parallel loop, elementwise blocks inlined into their neighbours, epilogues attached
to a tile."""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad
from tvm.s_tir.dlight.analysis import SBlockInfo

from relaxc.passes.legalize import STAGE_ATTR

MIN_PARALLEL_ROWS = 16  # fewer rows than this: one flat parallel loop balances better
L1_BYTES = 32 * 1024  # the smallest L1 data cache of the CPUs seen (Zen 3): a tile's weights over it reduce in chunks
L2_BYTES = 512 * 1024  # the smallest L2 cache of the CPUs seen (Zen 3)
TRANSCENDENTAL = {"tirx.exp", "tirx.sigmoid", "tirx.tanh", "tirx.erf", "tirx.pow", "tirx.log"}


def loop_extent(sch: s_tir.Schedule, loop: s_tir.schedule.LoopRV) -> int | None:
    extent = sch.get(loop).extent
    return int(extent) if isinstance(extent, tirx.IntImm) else None


def vector_width(extent: int | None, lanes: int) -> int:
    """Largest vector width that divides ``extent`` (no tail loop), or 1 if none is worth it."""
    if extent is None or extent <= 1:
        return 1
    if extent <= lanes:
        return extent
    for width in range(lanes, max(lanes // 4, 2) - 1, -1):
        if extent % width == 0:
            return width
    return 1


def range_names(index: tvm.ir.Range) -> set[str]:
    """The names of the iterators one index range of a buffer region depends on."""
    return {v.name for v in tirx.analysis.undefined_vars(index.min)}


def index_names(region: tirx.BufferRegion) -> set[str]:
    """The names of the variables a buffer region is indexed by."""
    return set().union(*(range_names(r) for r in region.region))


def buffer_bytes(buffer: tirx.Buffer) -> int:
    return math.prod(int(d) for d in buffer.shape) * buffer.dtype.bits // 8


def schedule_spatial(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, lanes: int) -> None:
    """All loops fused into one parallel loop around a vector; but where the innermost loop is
    shorter than a vector (a 4-lane input block), vectors run along rows of the last two loops and
    the rows in parallel: a vector across rows would mix their index patterns (the stem's padding
    of a 224x224x4 input: 0.43 ms that way, 0.03 ms along rows). Rows longer than a vector but not
    a whole number of them, read otherwise than the write (a pad, a slice, a broadcast), run as
    each row's whole vectors then a scalar tail, the rows in parallel."""
    loops = sch.get_loops(block)
    if not loops:
        return
    outer = loops[:-2]
    extent = math.prod(loop_extent(sch, loop) or 0 for loop in outer)
    if (loop_extent(sch, loops[-1]) or lanes) < lanes and extent >= MIN_PARALLEL_ROWS:
        sch.fuse(*loops[-2:])
        vectorize_innermost(sch, block, lanes)
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
        return
    if _transposed_tiles(sch, block, lanes) or _lanes_from_tables(sch, block):
        return
    innermost = loop_extent(sch, loops[-1]) or 0
    if len(loops) > 1 and innermost % lanes == 0 and innermost:
        # whole vectors along the innermost loop: split them off before fusing the rest, so no lane
        # index takes part in the outer indices (a condition on an outer index, a concat's part,
        # stays one per vector instead of scalarising the loop: 6.9 ms to 0.6 ms in MixNet)
        rest, vector = sch.split(loops[-1], factors=[None, lanes])
        sch.vectorize(vector)
        sch.parallel(sch.fuse(*loops[:-1], rest))
        return
    if len(loops) > 1 and innermost > lanes and extent * (loop_extent(sch, loops[-2]) or 0) >= MIN_PARALLEL_ROWS \
            and not _elementwise(sch.get(block)):
        # rows of whole vectors and a scalar tail: a vector across rows gathers lane by lane when
        # the reads are not indexed as the write is (ViT's 197 x 197 attention padded to 200 rows:
        # 0.73 ms, 5 % of its bandwidth)
        body, _ = sch.loop_partition(loops[-1], [innermost // lanes * lanes, None])
        _, vector = sch.split(body, factors=[None, lanes])
        sch.vectorize(vector)
        sch.parallel(sch.fuse(*loops[:-1]))
        return
    if len(loops) > 1:
        sch.fuse(*loops)
    outer = vectorize_innermost(sch, block, lanes)
    if outer is not None:
        sch.parallel(outer)


def _elementwise(stmt: tirx.SBlock) -> bool:
    """Whether every read is of a buffer shaped as the written one, at the same index."""
    write = stmt.writes[0]
    return all(len(read.region) == len(write.region)
               and all(tvm_ffi.structural_equal(a.min, b.min) for a, b in zip(read.region, write.region))
               and all(tvm_ffi.structural_equal(a, b) for a, b in zip(read.source.shape, write.source.shape))
               for read in stmt.reads)


def _transposed_tiles(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, lanes: int) -> bool:
    """A copy of one input (or a function of it) whose output runs along memory with an iterator that
    reads across rows of the input, while another iterator reads along them (a transpose): tiles of
    a vector of output columns by ``lanes`` input columns, so each input row a vector gathers from
    is read whole within the tile (XCiT's token-channel transposes, fused across the output's rows,
    ran at 7 % of their bandwidth). The output's innermost iterator need not be the block's last: a
    pad of BERT's keys written transposed iterates as its input does (0.60 ms for 4 layers at 384
    tokens as one vector along the input, 0.04 ms so). Returns False, scheduling nothing, for any
    other block."""
    stmt, loops = sch.get(block), sch.get_loops(block)
    if len(stmt.reads) != 1 or len(stmt.writes) != 1 or len(loops) < 2 or len(stmt.iter_vars) != len(loops) \
            or None in [loop_extent(sch, loop) for loop in loops]:
        return False
    names = [v.var.name for v in stmt.iter_vars]
    read_inner, write_inner = range_names(stmt.reads[0].region[-1]), range_names(stmt.writes[0].region[-1])
    along = next((i for i, name in enumerate(names) if write_inner == {name}), None)  # the output's innermost
    if along is None or names[along] in read_inner:
        return False
    across = [i for i, name in enumerate(names) if i != along and name in read_inner]  # along the input's rows
    if not across:
        return False
    column = loops[across[-1]]
    width, rows = vector_width(loop_extent(sch, loops[along]), lanes), largest_factor(loop_extent(sch, column), lanes)
    if width == 1 or rows == 1:
        return False
    _, column_inner = sch.split(column, factors=[None, rows])
    _, vector = sch.split(loops[along], factors=[None, width])
    inner = {sch.get(column_inner), sch.get(vector)}
    outer = [loop for loop in sch.get_loops(block) if sch.get(loop) not in inner]
    sch.reorder(*outer, column_inner, vector)
    sch.parallel(sch.fuse(*outer))
    sch.unroll(column_inner)
    sch.vectorize(vector)
    return True


def _table_names(value: tirx.PrimExpr) -> set[str]:
    """The iterators that index a load which is itself an index of another load (a table lookup)."""
    names: set[str] = set()

    def note(load: TensorLoad) -> TensorLoad:
        for index in load.indices:
            tvm_ffi.structural_map(index, (TensorLoad, lambda inner: names.update(
                v.name for i in inner.indices for v in tirx.analysis.undefined_vars(i)) or inner))
        return load

    tvm_ffi.structural_map(value, (TensorLoad, note))
    return names


def _lanes_from_tables(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """A block whose innermost iterator picks its source through a table (a channel gather of
    blocked data: ShuffleNet's shuffles, takes and concats across blocks), with no transcendental
    work: the iterators the tables read outside, in parallel, and each of their points copied along
    the other loops, its source fixed. A vector over the lanes gathered element by element with the
    lookups repeated (ShuffleNetV2's shuffles at 7 % of their bandwidth). Returns False, scheduling
    nothing, for any other block."""
    stmt, loops = sch.get(block), sch.get_loops(block)
    if len(stmt.iter_vars) != len(loops) or not isinstance(stmt.body, tirx.BufferStore) or _costly(sch, block):
        return False
    names = [v.var.name for v in stmt.iter_vars]
    tables = _table_names(stmt.body.value)
    if names[-1] not in tables or all(name in tables for name in names):
        return False
    outer = [loop for loop, name in zip(loops, names) if name in tables]
    sch.reorder(*outer, *(loop for loop, name in zip(loops, names) if name not in tables))
    sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    return True


def largest_factor(extent: int | None, limit: int) -> int:
    """Largest factor of ``extent`` up to ``limit`` (1 if none): a tile with no tail loop."""
    return next((t for t in range(limit, 1, -1) if extent and extent % t == 0), 1)


def vectorize_innermost(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV,
                         lanes: int) -> s_tir.schedule.LoopRV | None:
    """Vectorise the block's innermost loop (split off a vector-wide part if it is longer).

    Returns the loop left outside the vector (None if the whole loop became one vector).
    """
    loop = sch.get_loops(block)[-1]
    width = vector_width(loop_extent(sch, loop), lanes)
    if width == 1:
        return loop
    if loop_extent(sch, loop) == width:
        sch.vectorize(loop)
        return None
    outer, inner = sch.split(loop, factors=[None, width])
    sch.vectorize(inner)
    return outer


def try_attach(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, loop: s_tir.schedule.LoopRV) -> bool:
    """Compute an epilogue under its producer's tile loop, if its access pattern allows."""
    if _reads_a_fixed_part(sch, block):
        return False
    try:
        sch.reverse_compute_at(block, loop, preserve_unit_loops=True)
    except s_tir.ScheduleError:
        return False
    return True


def _reads_a_fixed_part(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether ``block`` reads a producer's output at a fixed index along a dimension longer than
    one (a slice of one channel block of a pooling). TVM 0.27's ``reverse_compute_at`` drops such
    an index from the region it relates to the tile, so the epilogue ran under every tile, each
    writing the same outputs from its own tile's values (the quantized fuzzer found it)."""
    produced = {sch.get(p).writes[0].source for p in sch.get_producers(block)}
    for read in sch.get(block).reads:
        if read.source in produced and any(
                isinstance(r.min, tirx.IntImm) and int(r.extent) == 1 and int(dim) > 1
                for r, dim in zip(read.region, read.source.shape)):
            return True
    return False


def inline_elementwise(sch: s_tir.Schedule, blocks: list[SBlockInfo]) -> list[SBlockInfo]:
    """Inline spatial blocks into their neighbours, but not a transcendental into a consumer that
    broadcasts it; padding, and blocks the legalisation marked (``STAGE_ATTR``: a separable resize's first pass),
    stay stages of their own. Padding read only by more padding inlines into it: attention's queries
    then keys padded in one kernel (T5's position bias at 384 tokens: 1.8 ms as stages, the first a
    dynamic row that no rule vectorises)."""
    pads = {b.name for b in blocks if b.is_data_pad(sch)}
    keep = [b for b in blocks if not b.is_injective() or (b.name in pads and not _into_pads(sch, b, pads))
            or STAGE_ATTR in sch.get(b.block_rv).annotations]
    remaining = [b for b in blocks if b not in keep]
    while True:  # as dl.try_inline: into consumers while any block can, then into a producer
        inlined = next((b for b in remaining if _inlinable(sch, b) and _try(sch.compute_inline, b)), None) or \
            next((b for b in remaining if _reverse_inlinable(sch, b) and _try(sch.reverse_compute_inline, b)), None)
        if inlined is None:
            break
        remaining.remove(inlined)
    order = {b.name: i for i, b in enumerate(blocks)}
    return sorted(keep + remaining, key=lambda b: order[b.name])


def _into_pads(sch: s_tir.Schedule, block: SBlockInfo, pads: set[str]) -> bool:
    """Whether every block reading ``block`` pads (each element read once, at clamped indices)."""
    consumers = sch.get_consumers(block.block_rv)
    return bool(consumers) and all(sch.get(c).name_hint in pads for c in consumers)


def _inlinable(sch: s_tir.Schedule, block: SBlockInfo) -> bool:
    """Whether inlining ``block`` redoes no costly work: a transcendental stays out of consumers
    that broadcast it. A copy or cast is still inlined into them: kept apart, a buffer of booleans
    between two stages meets a TVM 0.27 code generation bug (BERT's attention mask)."""
    return not (any(broadcasts(sch, c, block.block_rv) for c in sch.get_consumers(block.block_rv))
                and _costly(sch, block.block_rv))


def _reverse_inlinable(sch: s_tir.Schedule, block: SBlockInfo) -> bool:
    """Whether ``block`` is the only reader of its one producer and runs over as many points.
    Without the first check, reverse_compute_inline leaves other readers reading a buffer nobody
    writes (ill-formed TIR; the fuzzer found it with a Split after a LeakyRelu, whose Select passes
    for padding). TVM 0.27 checks neither bound of the second: on a broadcast it fails internally,
    not with a ScheduleError, and a block reading part of its producer (a resize to one row reads
    row 0) is inlined into the producer's loops, writing each output once per producer point."""
    producers = sch.get_producers(block.block_rv)
    if len(producers) != 1 or len(sch.get_consumers(producers[0])) != 1:
        return False
    sizes = points(sch, block.block_rv), points(sch, producers[0])
    return None not in sizes and sizes[0] == sizes[1]


def points(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> int | None:
    """How many points the block's spatial iterators cover (None if not static)."""
    extents = [v.dom.extent for v in sch.get(block).iter_vars if v.iter_type == tirx.IterVar.DataPar]
    return math.prod(int(e) for e in extents) if all(isinstance(e, tirx.IntImm) for e in extents) else None


def broadcasts(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, producer: s_tir.schedule.SBlockRV) -> bool:
    """Whether ``block`` runs over more points than its ``producer`` computes: it broadcasts the
    producer's result (a squeeze-excitation scale applied to a whole feature map). Inlined there,
    the producer's work (a sigmoid) is redone at every point; computed in a reduction's tile loop,
    the block runs on as many threads as the reduction has tiles, often one: EfficientNet's
    excitation conv with its 56 x 56 x 144 multiply took 0.15 ms that way."""
    sizes = points(sch, block), points(sch, producer)
    return None not in sizes and sizes[0] > sizes[1]


def _costly(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether the block evaluates a transcendental function (tens of instructions per value)."""
    calls = []
    tvm_ffi.structural_map(sch.get(block).body, (tvm.ir.Call, lambda call: calls.append(call.op) or call))
    return any(getattr(op, "name", None) in TRANSCENDENTAL for op in calls)


def _try(primitive, block: SBlockInfo) -> bool:
    try:
        primitive(block.block_rv)
        return True
    except s_tir.schedule.ScheduleError:
        return False
