"""schedules/cpu/tiled.py and tile_plan.py: the tiling heuristics, and when the Tiled rule declines a kernel."""

import math
import re

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import s_tir, te, tirx, topi
from tvm.target import Target

import relaxc
from relaxc.schedules.cpu import Basic, Tiled, tile_plan, tiled
from relaxc.schedules.cpu.steps import vector_width as _vector_width
from relaxc.schedules.cpu.tile_plan import MAX_TILE, tile_factor
from relaxc.support import targets
from tests import helpers, reference

AVX512 = Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})


@pytest.mark.parametrize("extent, lanes, width", [
    (64, 16, 16),  # a whole number of vectors
    (12, 16, 12),  # shorter than a vector: all of it
    (18, 16, 9),  # the largest divisor down to a quarter of the lanes: no tail loop
    (17, 16, 1),  # prime: not worth a vector
    (1, 16, 1),
    (None, 16, 1),  # symbolic
    (24, 8, 8),
])
def test_vector_width_divides_the_extent(extent, lanes, width):
    assert _vector_width(extent, lanes) == width


@pytest.mark.parametrize("extent, tile", [(56, 8), (14, 7), (13, 1), (6, 6), (None, 1)])
def test_register_tile_is_the_largest_factor_up_to_the_limit(extent, tile):
    assert tile_factor(extent) == tile and tile <= MAX_TILE


def _matmul() -> tirx.PrimFunc:
    a = te.placeholder((32, 64), name="a")
    b = te.placeholder((64, 48), name="b")
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute((32, 48), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    return te.create_prim_func([a, b, c])


matmul = _matmul()


class _Block:
    """Stands in for dlight's SBlockInfo: only its loop kinds matter here."""

    def __init__(self, kinds: str) -> None:
        self.kinds = list(kinds)

    def dom_kind(self) -> list[str]:
        return self.kinds


@pytest.mark.parametrize("kinds, fits", [("SSR", True), ("SSSSRRRR", True), ("RS", False), ("SRS", False),
                                         ("R", False), ("SO", False),
                                         ("SS", False)])  # a reduction left without reduction loops
def test_tiled_takes_spatial_loops_then_reduction_loops_only(kinds, fits):
    assert tiled._spatial_then_reduction(_Block(kinds)) == fits


def test_tiled_schedules_a_spatial_then_reduction_kernel():
    sch = Tiled().apply(matmul, AVX512, False)
    assert isinstance(sch, s_tir.Schedule)
    text = sch.mod.script()
    assert "T.parallel" in text and "T.vectorized" in text and '"local"' in text  # accumulators in registers


def test_tiled_declines_a_kernel_of_another_shape_and_basic_takes_it(monkeypatch):
    monkeypatch.setattr(tiled, "_spatial_then_reduction", lambda _block: False)
    assert Tiled().apply(matmul, AVX512, False) is None
    assert "T.parallel" in Basic().apply(matmul, AVX512, False).mod.script()


def test_cpu_rules_are_for_cpus_only():
    cuda = Target({"kind": "cuda", "arch": "sm_80"})
    assert Tiled().is_target_available(AVX512) and not Tiled().is_target_available(cuda)
    assert Basic().is_target_available(AVX512) and not Basic().is_target_available(cuda)


def _blocked_conv(channels: int = 64, size: int = 56) -> tirx.PrimFunc:
    """A 3x3 conv in NCHW16c, ``channels`` -> ``channels`` on a ``size`` x ``size`` map (64 on 56
    x 56 by default), as the layout pass makes it."""
    blocks = channels // 16
    data = te.placeholder((1, blocks, size + 2, size + 2, 16), name="data")
    weight = te.placeholder((blocks, blocks, 3, 3, 16, 16), name="weight")
    ic, kh, kw, ib = (te.reduce_axis((0, n), name) for n, name in ((blocks, "ic"), (3, "kh"), (3, "kw"), (16, "ib")))
    out = te.compute((1, blocks, size, size, 16), lambda n, o, y, x, i: te.sum(
        data[n, ic, y + kh, x + kw, ib] * weight[o, ic, kh, kw, ib, i], axis=[ic, kh, kw, ib]), name="conv")
    return te.create_prim_func([data, weight, out])


def _accumulators(sch: s_tir.Schedule) -> tuple[int, int]:
    """(accumulator vectors, vector width) of the scheduled conv's register tile."""
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("conv_update"))]
    unrolled = [int(loop.extent) for loop in loops if loop.kind == tirx.ForKind.UNROLLED]
    vector = [int(loop.extent) for loop in loops if loop.kind == tirx.ForKind.VECTORIZED]
    return math.prod(unrolled), vector[0]


@pytest.mark.parametrize("mcpu, tile", [("znver4", (16, 16)),  # 4 columns x 4 channel blocks of 32 registers
                                        ("znver3", (8, 8))])  # AVX2's 16 registers: 4 columns x 2 blocks
def test_conv_tile_reuses_each_broadcast_input_where_registers_allow(mcpu, tile):
    target = Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    assert _accumulators(Tiled().apply(_blocked_conv(), target, False)) == tile


@pytest.mark.parametrize("mcpu, unrolled", [("znver4", [4, 4]),  # 4 channel blocks x 4 columns: 8 loads per 16 FMAs
                                            ("znver3", [2, 4])])  # AVX2: 2 x 4, 6 loads per 8 FMAs (8 x 1: 9)
def test_a_blocked_3x3_conv_tile_is_as_square_as_the_row_allows(mcpu, unrolled):
    target = Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    sch = Tiled().apply(_blocked_conv(), target, False)
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("conv_update"))]
    assert [int(loop.extent) for loop in loops if loop.kind == tirx.ForKind.UNROLLED] == unrolled


def test_a_read_indexed_by_every_tiled_axis_is_not_reused():
    """Pooling reads its input at the vectorised channel too: nothing is broadcast, one axis tiled."""
    data = te.placeholder((1, 4, 58, 58, 16), name="data")
    kh, kw = te.reduce_axis((0, 3), "kh"), te.reduce_axis((0, 3), "kw")
    out = te.compute((1, 4, 56, 56, 16), lambda n, o, y, x, i: te.max(data[n, o, y + kh, x + kw, i], axis=[kh, kw]),
                     name="conv")
    assert _accumulators(Tiled().apply(te.create_prim_func([data, out]), AVX512, False)) == (8, 16)


def _pointwise_conv(channels: int, size: int = 14, out_channels: int = 256) -> tirx.PrimFunc:
    """A 1x1 conv in NCHW16c with ReLU, ``channels`` -> ``out_channels`` on a ``size`` x ``size``
    map (unit kernel loops included, as the layout pass makes it)."""
    data = te.placeholder((1, channels // 16, size, size, 16), name="data")
    weight = te.placeholder((out_channels // 16, channels // 16, 1, 1, 16, 16), name="weight")
    ic, kh, kw, ib = (te.reduce_axis((0, n), name) for n, name in ((channels // 16, "ic"), (1, "kh"), (1, "kw"), (16, "ib")))
    out = te.compute((1, out_channels // 16, size, size, 16), lambda n, o, y, x, i: te.sum(
        data[n, ic, y + kh, x + kw, ib] * weight[o, ic, kh, kw, ib, i], axis=[ic, kh, kw, ib]), name="conv")
    relu = te.compute(out.shape, lambda *i: te.max(out(*i), 0.0), name="relu")
    return te.create_prim_func([data, weight, relu])


@pytest.mark.parametrize("row, channels, tile", [
    (56, 4, (4, 4)),  # 8 loads per 16 FMAs; 8 x 2 would load 10
    (28, 32, (4, 4)),
    (14, 16, (7, 2)),  # 7 is the row's only factor from 4 to 8
    (7, 3, (7, 3)),
    (13, 4, None)])  # no factor from 4 to 8: the row tile rule decides
def test_square_tile_loads_fewest_vectors_per_fma(row, channels, tile):
    assert tile_plan.square_tile(row, channels, 24) == tile


@pytest.mark.parametrize("mcpu, unrolled", [("znver4", [4, 4]),  # AVX-512: 4 channel blocks x 4 columns
                                            ("znver3", [2, 4])])  # AVX2's 16 registers: 2 channel blocks x 4 columns
def test_a_pointwise_conv_tiles_output_channels_as_far_as_columns(mcpu, unrolled):
    target = Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    sch = Tiled().apply(_pointwise_conv(64, size=56, out_channels=64), target, False)
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("conv_update"))]
    assert [int(loop.extent) for loop in loops if loop.kind == tirx.ForKind.UNROLLED] == unrolled


def _row_binding(sch: s_tir.Schedule) -> str:
    """How the conv's output row is bound to the loops (TVMScript of the row's block variable)."""
    script = sch.mod.script()
    update = script[script.index('sblock("conv_update")'):]
    return next(line for line in update.splitlines() if "v1 = T.axis.spatial" in line)


@pytest.mark.parametrize("channels, out_channels, rows_first", [
    (256, 128, True),  # input 3.2 MB, weights 0.1 MB and output 1.6 MB: each thread reads half the rows
    (64, 256, False)])  # output 3.2 MB: each thread writes half the channels
def test_a_conv_whose_input_dominates_runs_rows_first_in_parallel(channels, out_channels, rows_first):
    sch = Tiled().apply(_pointwise_conv(channels, size=56, out_channels=out_channels), AVX512, False)
    assert ("%" not in _row_binding(sch)) == rows_first  # the row is the parallel loop's outermost part


def _serial_extents(sch: s_tir.Schedule, block: str) -> list[int]:
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock(block))]
    return [int(loop.extent) for loop in loops if loop.kind == tirx.ForKind.SERIAL]


@pytest.mark.parametrize("channels, serial", [
    (1024, [1024 // 128, 7, 2, 1, 128 // 16, 16]),  # chunks of 128 channels outside the tiles of 7 rows
    (256, [256 // 16, 16])])  # a shorter reduction: each tile reduces over all of it
def test_a_long_pointwise_reduction_runs_in_chunks_over_rows_of_tiles(channels, serial):
    """The chunk loop encloses the rows' tiles, the accumulators initialised once outside it."""
    sch = Tiled().apply(_pointwise_conv(channels), AVX512, False)
    assert _serial_extents(sch, "conv_update") == serial
    assert (len(_serial_extents(sch, "conv_init")) == 3) == (channels >= tile_plan.LONG_REDUCTION)


@pytest.mark.parametrize("mcpu, channels, size, serial", [
    ("znver4", 512, 7, [32, 7, 1, 1, 1, 3, 3, 16]),  # weights 9.4 MB, a tile's 590 KB: chunks of one block
    ("znver4", 64, 56, [4, 3, 3, 16]),  # input 0.9 MB, weights 0.1 MB: each tile reduces over all of it
    ("znver3", 512, 7, [32, 3, 3, 16])])  # AVX2: a row tile alone, no chunks
def test_a_3x3_conv_whose_tile_weights_outgrow_l1_reduces_in_chunks(mcpu, channels, size, serial):
    target = Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    sch = Tiled().apply(_blocked_conv(channels, size), target, False)
    assert _serial_extents(sch, "conv_update") == serial


def _run_on_host(func: tirx.PrimFunc, data_shape: tuple, weight_shape: tuple,
                 out_shape: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``func`` scheduled by ``Tiled`` for this machine and run on seeded random data and weights:
    (data, weight, output)."""
    target = targets.resolve("cpu")
    lib = tvm.compile(Tiled().apply(func, target, False).mod, target=target)
    rng = np.random.default_rng(0)
    data = rng.standard_normal(data_shape).astype(np.float32)
    weight = rng.standard_normal(weight_shape).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros(out_shape, np.float32))
    lib(tvm.runtime.tensor(data), tvm.runtime.tensor(weight), out)
    return data, weight, out.numpy()


def test_a_weight_bound_3x3_conv_computes_the_conv():
    """In chunks on an AVX-512 host (the schedule above), tile by tile on an AVX2 one."""
    data, weight, out = _run_on_host(_blocked_conv(512, 7), (1, 32, 9, 9, 16), (32, 32, 3, 3, 16, 16),
                                     (1, 32, 7, 7, 16))
    windows = np.lib.stride_tricks.sliding_window_view(data[0], (3, 3), axis=(1, 2))  # c, y, x, b, kh, kw
    expected = np.einsum("cyxbhw,ochwbi->oyxi", windows, weight)
    np.testing.assert_allclose(out[0], expected, rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("channels, out_channels, size", [
    (1024, 256, 14),  # reduced in chunks
    (256, 128, 56)])  # rows first in parallel (AVX-512)
def test_a_pointwise_conv_computes_the_conv(channels, out_channels, size):
    data, weight, out = _run_on_host(_pointwise_conv(channels, size, out_channels), (1, channels // 16, size, size, 16),
                                     (out_channels // 16, channels // 16, 1, 1, 16, 16),
                                     (1, out_channels // 16, size, size, 16))
    expected = np.maximum(np.einsum("cyxb,ocbi->oyxi", data[0], weight[:, :, 0, 0]), 0)
    np.testing.assert_allclose(out[0], expected, rtol=1e-4, atol=1e-3)


def _padded_conv(depthwise: bool) -> tirx.PrimFunc:
    """A 3x3 conv of a padded NCHW16c input: depthwise, or over all input channels."""
    data = te.placeholder((1, 2, 14, 14, 16), name="data")
    padded = topi.nn.pad(data, [0, 0, 1, 1, 0], [0, 0, 1, 1, 0], name="data_pad")
    kh, kw = te.reduce_axis((0, 3), "kh"), te.reduce_axis((0, 3), "kw")
    if depthwise:
        weight = te.placeholder((2, 3, 3, 16), name="weight")
        out = te.compute((1, 2, 14, 14, 16), lambda n, o, y, x, i: te.sum(
            padded[n, o, y + kh, x + kw, i] * weight[o, kh, kw, i], axis=[kh, kw]), name="conv")
    else:
        weight = te.placeholder((2, 2, 3, 3, 16, 16), name="weight")
        ic, ib = te.reduce_axis((0, 2), "ic"), te.reduce_axis((0, 16), "ib")
        out = te.compute((1, 2, 14, 14, 16), lambda n, o, y, x, i: te.sum(
            padded[n, ic, y + kh, x + kw, ib] * weight[o, ic, kh, kw, ib, i], axis=[ic, kh, kw, ib]), name="conv")
    return te.create_prim_func([data, weight, out])


@pytest.mark.parametrize("depthwise", [True, False])
def test_padding_is_inlined_into_depthwise_convs_only(depthwise):
    """A depthwise conv reads each padded value once: the padding is tested in its loads. A conv
    over input channels reuses each value many times: the padding stays a stage of its own."""
    text = Tiled().apply(_padded_conv(depthwise), AVX512, False).mod.script()
    assert ('T.sblock("data_pad")' in text) != depthwise


def _strided_padded_conv(channels: int, size: int) -> tirx.PrimFunc:
    """A stride-2 3x3 conv of a padded NCHW16c input, ``channels`` -> ``channels`` from ``size`` x
    ``size`` (ResNet's downsampling convs)."""
    blocks = channels // 16
    data = te.placeholder((1, blocks, size, size, 16), name="data")
    padded = topi.nn.pad(data, [0, 0, 1, 1, 0], [0, 0, 1, 1, 0], name="data_pad")
    weight = te.placeholder((blocks, blocks, 3, 3, 16, 16), name="weight")
    ic, kh, kw, ib = (te.reduce_axis((0, n), name) for n, name in ((blocks, "ic"), (3, "kh"), (3, "kw"), (16, "ib")))
    out = te.compute((1, blocks, size // 2, size // 2, 16), lambda n, o, y, x, i: te.sum(
        padded[n, ic, 2 * y + kh, 2 * x + kw, ib] * weight[o, ic, kh, kw, ib, i], axis=[ic, kh, kw, ib]), name="conv")
    return te.create_prim_func([data, weight, out])


@pytest.mark.parametrize("channels, size, per_tile", [
    (128, 56, True),  # input 1.6 MB, weights 0.6 MB: rows first, each tile pads what it reads
    (256, 56, False),  # rows first, but four tiles of output channels would each pad the same input
    (512, 14, False)])  # weights 9.4 MB: reduces in chunks, after a padded copy of the whole input
def test_a_rows_first_conv_pads_its_input_per_tile(channels, size, per_tile):
    sch = Tiled().apply(_strided_padded_conv(channels, size), AVX512, False)
    pad, conv = sch.get_sblock("data_pad"), sch.get_sblock("conv_update")
    assert (sch.get(pad).writes[0].source.scope() == "local") == per_tile
    assert (sch.get(sch.get_loops(pad)[0]) == sch.get(sch.get_loops(conv)[0])) == per_tile  # under its parallel loop


@pytest.mark.parametrize("channels, chunks", [
    (512, 16),  # a tile's weights 147 KB and the input 400 KB outgrow L2: chunks of two blocks
    (256, None)])  # 73 KB and 200 KB: each tile reduces over all of it
def test_an_avx2_tile_of_one_channel_block_reduces_in_chunks_where_l2_is_outgrown(channels, chunks):
    """AVX2's 16 registers hold one output channel block's row tile on a 7-wide map."""
    sch = Tiled().apply(_strided_padded_conv(channels, 14), Target({"kind": "llvm", "mcpu": "znver3"}), False)
    serial = _serial_extents(sch, "conv_update")
    assert (serial[0] if len(serial) > 4 else None) == chunks


@pytest.mark.parametrize("channels, size", [
    (128, 56),  # per tile on an AVX-512 host (the schedule above), a padded copy first on an AVX2 one
    (512, 14)])  # in chunks on both
def test_a_strided_conv_computes_the_conv(channels, size):
    blocks, half = channels // 16, size // 2
    data, weight, out = _run_on_host(_strided_padded_conv(channels, size), (1, blocks, size, size, 16),
                                     (blocks, blocks, 3, 3, 16, 16), (1, blocks, half, half, 16))
    padded = np.pad(data[0], ((0, 0), (1, 1), (1, 1), (0, 0)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(1, 2))[:, ::2, ::2][:, :half, :half]
    expected = np.einsum("cyxbhw,ochwbi->oyxi", windows, weight)
    np.testing.assert_allclose(out[0], expected, rtol=1e-4, atol=1e-2)


def _excitation() -> tirx.PrimFunc:
    """A squeeze-excitation tail in NCHW16c: a 1x1 conv of the pooled 1x1 map, sigmoid, and the
    channel-wise multiply of a 28x28 feature map."""
    pooled = te.placeholder((1, 1, 1, 1, 16), name="pooled")
    weight = te.placeholder((4, 1, 1, 1, 16, 16), name="weight")
    features = te.placeholder((1, 4, 28, 28, 16), name="features")
    ib = te.reduce_axis((0, 16), "ib")
    conv = te.compute((1, 4, 1, 1, 16), lambda n, o, y, x, i: te.sum(pooled[n, 0, y, x, ib] * weight[o, 0, 0, 0, ib, i],
                                                                     axis=ib), name="conv")
    scale = te.compute(conv.shape, lambda *i: te.sigmoid(conv(*i)), name="scale")
    out = te.compute(features.shape, lambda n, o, y, x, i: features[n, o, y, x, i] * scale[n, o, 0, 0, i], name="out")
    return te.create_prim_func([pooled, weight, features, out])


def test_an_epilogue_that_broadcasts_the_reduction_runs_apart_and_in_parallel():
    """The sigmoid runs once per channel with the conv, not at every point of the map it scales,
    and the multiply runs in a parallel loop of its own, not in the conv's single tile."""
    sch = Tiled().apply(_excitation(), AVX512, False)
    multiply = sch.get(sch.get_sblock("out"))
    assert "sigmoid" not in str(multiply.body)
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("out"))]
    assert loops[0].kind == tirx.ForKind.PARALLEL and int(loops[0].extent) > 1


def _classifier(depth: int, columns: int) -> tirx.PrimFunc:
    """A classifier's FC as the importer makes it: a 1 x K vector times a K x N matrix, plus a bias."""
    x = te.placeholder((1, depth), name="x")
    weight = te.placeholder((depth, columns), name="weight")
    bias = te.placeholder((columns,), name="bias")
    k = te.reduce_axis((0, depth), name="k")
    product = te.compute((1, columns), lambda i, j: te.sum(x[i, k] * weight[k, j], axis=k), name="matmul")
    out = te.compute((1, columns), lambda i, j: product[i, j] + bias[j], name="add")
    return te.create_prim_func([x, weight, bias, out])


@pytest.mark.parametrize("depth, columns, parts", [(2048, 1000, 8),  # ResNet-50's classifier
                                                   (256, 64, None)])  # too small: split by columns
def test_a_large_matrix_vector_product_streams_rows_in_parallel_parts(depth, columns, parts):
    sch = Tiled().apply(_classifier(depth, columns), AVX512, False)
    in_parts = "matmul_rf_update" in sch.mod["main"].script()  # partial sums (rfactor) only in parts
    assert in_parts == (parts is not None)
    if in_parts:
        loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("matmul_rf_update"))]
        assert [int(loop.extent) for loop in loops if loop.kind == tirx.ForKind.PARALLEL] == [parts]


def test_a_matrix_vector_product_in_parts_computes_the_product():
    target = targets.resolve("cpu")
    lib = tvm.compile(Tiled().apply(_classifier(2048, 1000), target, False).mod, target=target)
    rng = np.random.default_rng(0)
    x, weight, bias = (rng.standard_normal(s).astype(np.float32) for s in ((1, 2048), (2048, 1000), (1000,)))
    out = tvm.runtime.tensor(np.zeros((1, 1000), np.float32))
    lib(*(tvm.runtime.tensor(a) for a in (x, weight, bias)), out)
    np.testing.assert_allclose(out.numpy(), x @ weight + bias, rtol=1e-4, atol=1e-3)


def test_a_matrix_vector_product_over_a_transposed_weight_is_not_split_in_parts():
    """An N x K weight: a vector of columns would gather from N rows; the parts are not for it."""
    x = te.placeholder((1, 2048), name="x")
    weight = te.placeholder((1000, 2048), name="weight")
    k = te.reduce_axis((0, 2048), name="k")
    product = te.compute((1, 1000), lambda i, j: te.sum(x[i, k] * weight[j, k], axis=k), name="matmul")
    sch = Tiled().apply(te.create_prim_func([x, weight, product]), AVX512, False)
    assert "matmul_rf" not in sch.mod["main"].script()


@pytest.mark.parametrize("width", [56, 28, 7])
def test_a_pool_over_nchw_pads_rows_apart_and_vectorises(width):
    """PoolFormer's token mixer (a 3x3 average pool, stride 1, padding not counted, less its input)
    on NCHW: the padding of W stays a stage of its own, a row's middle copied as one vector, so the
    pool's loads test no bound per lane (inlined, the test scalarised the pool: 2 % of its roofline)."""
    nodes = [helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              count_include_pad=0),
             helper.make_node("Sub", ["p", "x"], ["out"])]
    shape = [1, 16, width, width]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                             [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)], [], 17)
    art = relaxc.compile(model, tuning="off", layout_block=0)
    (name, func), = [(gv.name_hint, f) for gv, f in art.module("final").functions.items() if "pool" in gv.name_hint]
    script = func.script()
    assert 'T.sblock("pad_temp' in script and "if_then_else" not in script.split('T.sblock("pool_sum_update")')[1]
    llvm_ir = helpers.kernel_llvm_ir(func, art.target)
    assert re.search(r"fadd <\d+ x float>", llvm_ir), name
    x = reference.random_inputs(art.inputs, seed=5)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


@pytest.mark.parametrize("shape, perm", [([1, 196, 384], [0, 2, 1]), ([2, 40, 6, 48], [0, 3, 2, 1])])
def test_a_transpose_copies_in_tiles_of_vectors_by_input_columns(shape, perm):
    """A transpose (XCiT's tokens and channels) runs in tiles: a vector of output columns by a few
    input columns, each gathered row read whole within the tile (fused across the output's rows as
    one vector loop it ran at 7 % of its bandwidth)."""
    out = [shape[p] for p in perm]
    model = reference._model([helper.make_node("Transpose", ["x"], ["t"], perm=perm),
                              helper.make_node("Relu", ["t"], ["out"])],
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                             [helper.make_tensor_value_info("out", TensorProto.FLOAT, out)], [], 17)
    art = relaxc.compile(model, tuning="off")
    (func,) = [f for gv, f in art.module("final").functions.items() if "transpose" in gv.name_hint]
    script = func.script()
    assert "T.unroll" in script and "T.vectorized" in script, script
    x = reference.random_inputs(art.inputs, seed=6)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


def test_keys_padded_and_written_transposed_copy_in_tiles():
    """A pad of attention's keys (batch, tokens, heads, depth) written transposed to (batch, heads,
    depth, padded tokens), the transpose inlined into the pad: the block iterates as its input does,
    and the output's innermost iterator (tokens) is not its last; it still runs in tiles, a vector
    of tokens by input columns (one vector along the depth scattered across the output ran 16x
    slower)."""
    x = te.placeholder((1, 409, 4, 64), name="x")
    pad = te.compute((1, 416, 4, 64), lambda n, s, h, d: te.if_then_else(s < 409, x[n, te.min(s, 408), h, d], 0.0),
                     name="pad_keys")
    out = te.compute((1, 4, 64, 416), lambda n, h, d, s: pad[n, s, h, d] * 0.125, name="scaled")
    sch = Tiled().apply(te.create_prim_func([x, out]), AVX512, False)
    script = sch.mod["main"].script()
    assert "T.unroll" in script and "T.vectorized" in script, script
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target="llvm")
    data = np.random.default_rng(0).standard_normal((1, 409, 4, 64)).astype(np.float32)
    got = tvm.runtime.tensor(np.zeros((1, 4, 64, 416), np.float32))
    lib["main"](tvm.runtime.tensor(data), got)
    want = np.pad(data, ((0, 0), (0, 7), (0, 0), (0, 0))).transpose(0, 2, 3, 1) * 0.125
    np.testing.assert_array_equal(got.numpy(), want)


def _batched_matmul(heads: int, rows: int, depth: int, columns: int) -> tirx.PrimFunc:
    a = te.placeholder((heads, rows, depth), name="a")
    b = te.placeholder((heads, depth, columns), name="b")
    k = te.reduce_axis((0, depth), name="k")
    out = te.compute((heads, rows, columns), lambda h, i, j: te.sum(a[h, i, k] * b[h, k, j], axis=k), name="matmul")
    return te.create_prim_func([a, b, out])


@pytest.mark.parametrize("mcpu", ["znver3", "znver4"])
def test_adjacent_vectors_of_a_matmul_tile_run_inside_its_rows(mcpu):
    """Attention's Q K^T (AVX2: 6 rows x 2 vectors): each broadcast of A feeds the row's vectors in
    turn, so the tile holds one broadcast, not one per row (those spilled: 25 -> 14 ms on Whisper's)."""
    target = Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    sch = Tiled().apply(_batched_matmul(2, 30, 64, 96), target, False)
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("matmul_update"))]
    tile = [loop for loop in loops if loop.kind in (tirx.ForKind.UNROLLED, tirx.ForKind.VECTORIZED)]
    assert len(tile) == 3 and tile[-1].kind == tirx.ForKind.VECTORIZED
    rows, vectors = (str(loop.loop_var.name) for loop in tile[:2])
    assert rows.startswith("ax1") and vectors.startswith("ax2"), (rows, vectors)  # rows (i) outside columns (j)
    data, weight, out = _run_on_host(_batched_matmul(2, 30, 64, 96), (2, 30, 64), (2, 64, 96), (2, 30, 96))
    np.testing.assert_allclose(out, data @ weight, rtol=1e-4, atol=1e-4)


def test_a_row_padding_of_odd_width_copies_whole_vectors_along_each_row():
    """Rows 197 wide (ViT's attention, padded to 200 rows for the matmul's tile): each row's whole
    vectors then a scalar tail; one vector loop across rows gathered lane by lane (5 % of its bandwidth)."""
    model = reference._model([helper.make_node("MatMul", ["p", "v"], ["out"])],
                             [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 4, 197, 197]),
                              helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, 4, 197, 64])],
                             [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 197, 64])], [], 17)
    art = relaxc.compile(model, tuning="off")
    pads = [f.script() for gv, f in art.module("final").functions.items() if gv.name_hint.startswith("pad")]
    row_pads = [s for s in pads if "T.int64(197), T.int64(197)" in s and "T.int64(200), T.int64(197)" in s]
    assert row_pads and all("_partition" in s and ("T.vectorized(T.int64(8))" in s or "T.vectorized(T.int64(16))" in s)
                            for s in row_pads), pads
    x = reference.random_inputs(art.inputs, seed=7)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


def test_a_channel_shuffle_of_blocked_data_copies_each_lane_along_the_map():
    """ShuffleNet's shuffle on NCHW{b}c data: each output channel (block, lane) in parallel, its
    source looked up once and copied along the map; a vector over the lanes gathered lane by lane
    with the lookups redone (7 % of its bandwidth)."""
    shape = [1, 32, 14, 14]
    ints = lambda name, values: helper.make_tensor(name, TensorProto.INT64, [len(values)], values)  # noqa: E731
    model = reference._model([helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
                              helper.make_node("Reshape", ["c", "split"], ["r"]),
                              helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
                              helper.make_node("Reshape", ["t", "back"], ["s"]),
                              helper.make_node("Conv", ["s", "w"], ["out"], kernel_shape=[1, 1])],
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                             [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)],
                             [helper.make_tensor("w", TensorProto.FLOAT, [32, 32, 1, 1],
                                                 np.random.default_rng(8).standard_normal(32 * 32).tolist()),
                              ints("split", [1, 2, 16, 14, 14]), ints("back", shape)], 17)
    art = relaxc.compile(model, tuning="off")
    takes = [f.script() for gv, f in art.module("final").functions.items() if "take" in gv.name_hint]
    assert len(takes) == 1 and "T.vectorized" not in takes[0] and "T.parallel(T.int64(32))" in takes[0], takes
    x = reference.random_inputs(art.inputs, seed=8)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


def test_an_epilogue_reading_one_channel_block_of_a_reduction_runs_after_it():
    """A max pooling whose consumer keeps its first channel block (a Split after Conv -> MaxPool
    in 8-lane blocks): attached under the pooling's tiles, every tile wrote that block from its
    own values (the quantized fuzzer found it); the slice runs as a stage of its own instead."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1]),
             helper.make_node("Split", ["p", "sizes"], ["y", "rest"], axis=1)]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12, 25, 11])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 13, 6])],
                             [reference._const("w", rng.standard_normal((34, 12, 1, 1))),
                              helper.make_tensor("sizes", TensorProto.INT64, [2], [8, 26])])
    art = relaxc.compile(model, tuning="off", layout_block=8)
    x = rng.standard_normal((1, 12, 25, 11)).astype(np.float32)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, {"x": x}))
