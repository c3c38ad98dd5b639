"""The ``Vnni`` CPU rule: blocked 8-bit convolutions on AVX-512 VNNI's ``vpdpbusd``.

A quantized convolution (``passes/quantized.py``) sums uint8 data times int8 weights into int32
NCHW16c lanes; the kernel is packed ``OIHW{i/4}i16o4i`` (``passes/legalize.py``), so one
``vpdpbusd`` multiplies a broadcast group of 4 input channels of one pixel by the 16 output lanes'
4 weights each and adds the 16 sums to an accumulator: 64 multiply-adds an instruction, 4 times
float32's FMA. Register tile: ``rows`` output pixels of a row by ``blocks`` output channel blocks
of accumulators (at most ``MAX_ACCUMULATORS``), the reduction (input blocks, kernel rows, columns,
groups of 4 channels) inside it, the tiles in one parallel loop; the epilogue (the scale to float,
bias, activation, the next quantize) is computed on each tile while its accumulators are in
registers, so only the uint8 result is written. TVM 0.27's own ``dot_16x4_vnni`` intrinsic does not
build with its LLVM (``vpdpbusd.512`` takes ``<64 x i8>`` operands now): the one here does.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import TensorIntrin
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.script import tirx as T
from tvm.target import Target

from relaxc.passes.dense import BYTE_GROUP, BYTE_LANES
from relaxc.schedules.cpu.rule import CpuRule, kernel_blocks
from relaxc.schedules.cpu.steps import inline_elementwise, loop_extent, try_attach, vectorize_innermost
from relaxc.schedules.cpu.tiled import schedule_padding
from relaxc.support.targets import VectorUnit, has_feature
from relaxc.support.tvm_internals import UncheckedSchedule

INTRIN = "relaxc_dot_16x4_vnni"
LANES, DEPTH = BYTE_LANES, BYTE_GROUP  # int32 accumulators in a 512-bit register, bytes each one's dot reads
MAX_ACCUMULATORS = 28  # of 32 registers: the rest hold the broadcast data and a block of weights
ROWS = (8, 7, 6, 5, 4, 3, 2, 1)  # output pixels of a tile, the first that divides the row
BLOCKS = (4, 3, 2, 1)  # output channel blocks of a tile


@T.prim_func(s_tir=True)
def _dot_16x4(A: T.Buffer((4,), "uint8", offset_factor=1), B: T.Buffer((16, 4), "int8", offset_factor=1),
              C: T.Buffer((16,), "int32", offset_factor=1, scope="local")) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:4], B[0:16, 0:4])
        T.writes(C[0:16])
        for i, k in T.grid(16, 4):
            with T.sblock("update"):
                vi, vk = T.axis.remap("SR", [i, k])
                C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")


@T.prim_func(s_tir=True)
def _vpdpbusd(A: T.Buffer((4,), "uint8", offset_factor=1), B: T.Buffer((16, 4), "int8", offset_factor=1),
              C: T.Buffer((16,), "int32", offset_factor=1, scope="local")) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:4], B[0:16, 0:4])
        T.writes(C[0:16])
        group = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
        C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"), C.vload([0], dtype="int32x16"),
            T.reinterpret(T.broadcast(group, 16), dtype="int8x64"), B.vload([0, 0], dtype="int8x64"),
            dtype="int32x16")


TensorIntrin.register(INTRIN, _dot_16x4, _vpdpbusd, override=True)  # accumulators in registers


def tile(width: int | None, out_blocks: int | None) -> tuple[int, int]:
    """Output pixels and channel blocks of a register tile: the most accumulators that fit, pixels
    first (each weight vector then serves them all)."""
    best = (1, 1)
    for rows in ROWS:
        for blocks in BLOCKS:
            if width % rows == 0 and out_blocks % blocks == 0 and rows * blocks <= MAX_ACCUMULATORS \
                    and rows * blocks > best[0] * best[1]:
                best = (rows, blocks)
    return best


class Vnni(CpuRule):
    """Blocked uint8 x int8 convolutions with their epilogues; None for any other kernel."""

    def is_target_available(self, target: Target) -> bool:
        return target.kind.name == "llvm" and has_feature("avx512vnni", target)

    def may_fit(self, func: tirx.PrimFunc) -> bool:
        return any(b.name_hint.startswith("conv2d_NCHWc") and _dtypes(b) == ("uint8", "int8", "int32")
                   for b in kernel_blocks(func))

    def schedule(self, func: tirx.PrimFunc, unit: VectorUnit) -> s_tir.Schedule | None:
        sch = UncheckedSchedule(func)
        blocks = normalize_prim_func(sch)
        if blocks is None:
            return None
        blocks = inline_elementwise(sch, blocks)
        reductions = [b for b in blocks if b.is_reduction()]
        if len(reductions) != 1 or not sch.get(reductions[0].block_rv).name_hint.startswith("conv2d_NCHWc"):
            return None
        conv = reductions[0].block_rv  # its types checked by may_fit
        roles = _roles(sch, conv)
        if roles is None:
            return None
        spatial, reduction, rib = roles
        lane = spatial.pop(4, None)
        if lane is None or loop_extent(sch, lane) != LANES or (loop_extent(sch, rib) or 1) % DEPTH:
            return None
        rows, count = tile(loop_extent(sch, spatial[3]) if 3 in spatial else 1,
                           loop_extent(sch, spatial[1]) if 1 in spatial else 1)
        inner = []
        for dim, factor in ((3, rows), (1, count)):
            if dim in spatial:
                spatial[dim], tile_loop = sch.split(spatial[dim], [None, factor])
                inner.append(tile_loop)
        group, depth = sch.split(rib, [None, DEPTH])
        outer = [spatial[dim] for dim in sorted(spatial)]
        if not outer:  # one tile (a 1x1 map's few channels): no loop to split between threads
            return None
        sch.reorder(*outer, *reduction, group, *inner, lane, depth)
        parallel = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        sch.parallel(parallel)
        write_back = sch.cache_write(conv, 0, "local")
        sch.reverse_compute_at(write_back, parallel, preserve_unit_loops=True)
        init = sch.decompose_reduction(conv, (reduction or [group])[0])
        sch.vectorize(sch.get_loops(init)[-1])
        sch.tensorize(lane, INTRIN)
        for loop in inner:
            sch.unroll(loop)
        vectorize_innermost(sch, write_back, unit.lanes)
        epilogue = [b.block_rv for b in blocks if not b.is_reduction() and not b.is_data_pad(sch)]
        attached = all(try_attach(sch, block, parallel) for block in epilogue)
        for block in epilogue:
            vectorize_innermost(sch, block, unit.lanes)
        if epilogue and attached:
            sch.compute_inline(write_back)
        for pad in (b for b in blocks if b.is_data_pad(sch)):
            schedule_padding(sch, pad, unit.lanes)
        return sch


def _roles(sch: s_tir.Schedule, conv: s_tir.schedule.SBlockRV):
    """The conv's spatial loops by the output dimension they index (0-4: N, C blocks, H, W, lanes;
    unit dimensions have no loop), its outer reduction loops, and the loop over the input lanes
    (the innermost reduction); None if they are not so."""
    stmt, loops = sch.get(conv), sch.get_loops(conv)
    if len(loops) != len(stmt.iter_vars):
        return None
    written = [r.min for r in stmt.writes[0].region]
    lanes_read = stmt.reads[0].region[-1].min
    spatial, reduction = {}, []
    for loop, iv in zip(loops, stmt.iter_vars):
        if iv.iter_type == tirx.IterVar.DataPar:
            dims = [d for d, index in enumerate(written) if index.same_as(iv.var)]
            if len(dims) != 1 or reduction:
                return None
            spatial[dims[0]] = loop
        else:
            reduction.append((loop, iv))
    if not reduction or not reduction[-1][1].var.same_as(lanes_read):
        return None
    return spatial, [loop for loop, _ in reduction[:-1]], reduction[-1][0]


def _dtypes(block: s_tir.SBlock) -> tuple[str, ...]:
    return tuple(str(region.source.dtype) for region in (*block.reads[-2:], block.writes[0]))
