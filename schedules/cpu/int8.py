"""The ``Int8`` CPU rule: blocked 8-bit convolutions on the CPU's byte dot product instruction.

A quantized convolution (``passes/quantized/products.py``) sums uint8 data times int8 weights into int32
NCHW{b}c lanes; the kernel is packed ``OIHW{i/d}i{o}o{d}i`` (``passes/legalize.py``), ``d`` the
target's ``ByteDot.depth``, so one instruction multiplies a broadcast group of ``d`` input channels
of one pixel by a vector of output lanes' ``d`` weights each and adds the sums to an accumulator:
AVX-512 VNNI's ``vpdpbusd`` 4 bytes deep (64 multiply-adds an instruction, 4x float32's FMA), and
without VNNI ``vpmaddubsw`` (pairs of products summed into int16, saturated) then ``pmaddwd`` with
ones (the pairs summed into int32), as onnxruntime's kernels there compute.
Register tile: ``rows`` output pixels of a row by ``blocks`` vectors of output channels (at most
``most_accumulators``: all vector registers but 4), the reduction (input blocks, kernel rows, columns, groups
of ``d`` channels) inside it, the tiles in one parallel loop; the epilogue (the scale to float,
bias, activation, the next quantize) is computed on each tile while its accumulators are in
registers, so only the uint8 result is written. TVM 0.27's own ``dot_16x4_vnni`` intrinsic does not
build with its LLVM (``vpdpbusd.512`` takes ``<64 x i8>`` operands now): the ones here do.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import TensorIntrin
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.script import tirx as T
from tvm.target import Target

from relaxc.passes.legalize import STAGE_ATTR
from relaxc.schedules.cpu.padding import schedule_padding
from relaxc.schedules.cpu.rule import CpuRule, kernel_blocks
from relaxc.schedules.cpu.steps import inline_elementwise, loop_extent, try_attach, vectorize_innermost
from relaxc.support.targets import ByteDot, VectorUnit, byte_dot, fitting
from relaxc.support.tvm_internals import UncheckedSchedule

ROWS = (8, 7, 6, 5, 4, 3, 2, 1)  # output pixels of a tile, the first that divides the row
BLOCKS = (4, 3, 2, 1)  # output channel vectors of a tile


def intrinsic(dot: ByteDot) -> str:
    """The name of the tensor intrinsic adding ``dot.lanes`` lanes' dot products of ``dot.depth``
    broadcast uint8 data elements by their int8 weights to int32 accumulators (registered on first
    use)."""
    name = f"relaxc_dot_{dot.lanes}x{dot.depth}_{dot.instruction.split('.', 2)[2].replace('.', '_')}"
    if name in _REGISTERED:
        return name
    lanes, depth, data, weights, instruction, pairs = dot
    accumulated, paired = f"int32x{lanes}", f"{weights}x{lanes * depth}"
    group = f"{data}x{depth}"  # one int32 lane's worth of data

    @T.prim_func(s_tir=True)
    def described(A: T.Buffer((depth,), data, offset_factor=1), B: T.Buffer((lanes, depth), weights, offset_factor=1),
                  C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:depth], B[0:lanes, 0:depth])
            T.writes(C[0:lanes])
            for i, k in T.grid(lanes, depth):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    accumulates = pairs is None  # vpdpbusd adds to its first operand; pmaddwd's sums are added here

    @T.prim_func(s_tir=True)
    def implemented(A: T.Buffer((depth,), data, offset_factor=1), B: T.Buffer((lanes, depth), weights, offset_factor=1),
                    C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:depth], B[0:lanes, 0:depth])
            T.writes(C[0:lanes])
            if accumulates:
                C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(instruction), C.vload([0], dtype=accumulated),
                    T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], group), dtype="int32"), lanes), dtype=paired),
                    B.vload([0, 0], dtype=paired), dtype=accumulated)
            else:  # vpmaddubsw's int16 pair sums (saturated), added in pairs by pmaddwd with ones
                C[T.ramp(T.int32(0), 1, lanes)] = C.vload([0], dtype=accumulated) + T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(pairs), T.call_llvm_pure_intrin(
                        T.llvm_lookup_intrinsic_id(instruction),
                        T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], group), dtype="int32"), lanes), dtype=paired),
                        B.vload([0, 0], dtype=paired), dtype=f"int16x{lanes * 2}"),
                    T.broadcast(T.int16(1), lanes * 2), dtype=accumulated)

    TensorIntrin.register(name, described, implemented, override=True)  # accumulators in registers
    _REGISTERED.add(name)
    return name


_REGISTERED: set[str] = set()


def tile(width: int | None, out_blocks: int | None, accumulators: int) -> tuple[int, int]:
    """Output pixels and channel vectors of a register tile: the most ``accumulators`` that fit,
    pixels first (each weight vector then serves them all)."""
    best = (1, 1)
    for rows in ROWS:
        for blocks in BLOCKS:
            if width % rows == 0 and out_blocks % blocks == 0 and rows * blocks <= accumulators \
                    and rows * blocks > best[0] * best[1]:
                best = (rows, blocks)
    return best


def most_accumulators(registers: int) -> int:
    """Accumulators a tile may keep: all registers but 4, which hold the broadcast data, a vector
    of weights and the pair sums before their add (28 of 32 measured best with VNNI)."""
    return registers - 4


class Int8(CpuRule):
    """Blocked uint8 x int8 convolutions with their epilogues; None for any other kernel."""

    def is_target_available(self, target: Target) -> bool:
        return byte_dot(target) is not None

    def may_fit(self, func: tirx.PrimFunc) -> bool:
        return any(b.name_hint.startswith("conv2d_NCHWc") and _dtypes(b)[0] == "uint8"
                   and _dtypes(b)[2] == "int32" for b in kernel_blocks(func))

    def schedule(self, func: tirx.PrimFunc, unit: VectorUnit) -> s_tir.Schedule | None:
        dot = unit.bytes
        sch = UncheckedSchedule(func)
        blocks = normalize_prim_func(sch)
        if blocks is None:
            return None
        blocks = inline_elementwise(sch, blocks)
        inputs = [b for b in blocks if b.is_data_pad(sch) or STAGE_ATTR in sch.get(b.block_rv).annotations]
        reductions = [b for b in blocks if b.is_reduction()]
        if len(reductions) != 1 or not sch.get(reductions[0].block_rv).name_hint.startswith("conv2d_NCHWc") \
                or _dtypes(sch.get(reductions[0].block_rv)) != (dot.data, dot.weights, "int32"):
            return None
        conv = reductions[0].block_rv
        roles = _roles(sch, conv)
        if roles is None:
            return None
        spatial, reduction, rib = roles
        lane = spatial.pop(4, None)
        dot = fitting(dot, loop_extent(sch, lane) or 1) if lane is not None else None
        if dot is None or (loop_extent(sch, rib) or 1) % dot.depth:
            return None
        vectors = loop_extent(sch, lane) // dot.lanes  # a block of two vectors (a measured layout choice)
        rows, count = tile(loop_extent(sch, spatial[3]) if 3 in spatial else 1,
                           loop_extent(sch, spatial[1]) if 1 in spatial else 1,
                           most_accumulators(unit.registers) // vectors)
        inner = []
        for dim, factor in ((3, rows), (1, count)):
            if dim in spatial:
                spatial[dim], tile_loop = sch.split(spatial[dim], [None, factor])
                inner.append(tile_loop)
        if vectors > 1:
            vector, lane = sch.split(lane, [vectors, dot.lanes])
            inner.append(vector)
        group, depth = sch.split(rib, [None, dot.depth])
        # one tile (a 1x1 map's few channels, as in squeeze-excitation blocks): a unit loop to hold it
        outer = [spatial[dim] for dim in sorted(spatial)] or [sch.add_unit_loop(conv)]
        sch.reorder(*outer, *reduction, group, *inner, lane, depth)
        parallel = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        sch.parallel(parallel)
        write_back = sch.cache_write(conv, 0, "local")
        sch.reverse_compute_at(write_back, parallel, preserve_unit_loops=True)
        init = sch.decompose_reduction(conv, (reduction or [group])[0])
        sch.vectorize(sch.get_loops(init)[-1])
        sch.tensorize(lane, intrinsic(dot))
        for loop in inner:
            sch.unroll(loop)
        vectorize_innermost(sch, write_back, unit.lanes)
        epilogue = [b.block_rv for b in blocks if not b.is_reduction() and b not in inputs]
        attached = all(try_attach(sch, block, parallel) for block in epilogue)
        for block in epilogue:
            vectorize_innermost(sch, block, unit.lanes)
        if epilogue and attached:
            sch.compute_inline(write_back)
        for stage in inputs:  # the data padded
            schedule_padding(sch, stage, unit.lanes)
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
