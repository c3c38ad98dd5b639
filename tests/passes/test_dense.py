"""passes/dense.py and the Dense rule: constant-weight matmuls packed, awkward shapes padded,
every form checked against numpy through the whole pipeline."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from onnx import TensorProto, helper, numpy_helper

import relaxc
from relaxc.passes.dense import PRODUCT_FEWEST_ROWS, ROW_TILE_MAX, Tile, padded_rows, register_tile, row_tile
from relaxc.support import targets
from tests import reference
from tests.helpers import host_runs_avx2


def _matmul_model(x_shape, weight: np.ndarray, bias: bool = False):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y" if bias else "out"])]
    inits = [numpy_helper.from_array(weight, "w")]
    if bias:
        nodes.append(helper.make_node("Add", ["y", "b"], ["out"]))
        inits.append(numpy_helper.from_array(np.arange(weight.shape[1], dtype=np.float32) * 0.01, "b"))
    out_shape = list(x_shape[:-1]) + [weight.shape[1]]
    return reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                            [helper.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)], inits)


AVX2 = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}  # 16 registers: other tiles than AVX-512's
TARGETS = ["cpu", pytest.param(AVX2, id="avx2", marks=pytest.mark.skipif(not host_runs_avx2(), reason="no AVX2"))]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("x_shape, n", [((1, 197, 64), 96), ((5, 32), 64), ((2, 3, 24, 48), 16),
                                        ((1, 128, 40), 48), ((1, 7, 16), 1000), ((1, 30, 24), 1024)])
def test_packed_matmul_matches_onnxruntime(x_shape, n, target):
    weight = np.random.default_rng(0).standard_normal((x_shape[-1], n)).astype(np.float32)
    model = _matmul_model(x_shape, weight, bias=True)
    art = relaxc.compile(model, target=target, tuning="off", validate_memory=True)
    assert art.report()["dense"]["packed"] == 1
    assert art.report()["schedules"].get("dense") == 1
    x = reference.random_inputs(art.inputs, seed=1)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


AVX512 = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}  # 32 registers: tiles of ROW_TILE_MAX rows


def test_rows_no_tile_divides_are_padded_inside_the_kernel():
    """Compiled (not run) for an AVX-512 CPU, whatever this one is: there the tile has ROW_TILE_MAX rows."""
    rows = 197
    assert row_tile(rows) == ROW_TILE_MAX and row_tile(196) == 7 and row_tile(5) == 5
    assert row_tile(196, 6) == 6 and row_tile(200, 6) == 5  # AVX2: 4 rows (8 accumulators) lost to padding to 198
    # attention's products keep rows Tiled tiles by 6 (Whisper's 1,500 tokens: padded, its tile fell to 8 x 1)
    assert padded_rows(1500, fewest=PRODUCT_FEWEST_ROWS) == 1500 and padded_rows(197, fewest=PRODUCT_FEWEST_ROWS) == 200
    art = relaxc.compile(_matmul_model((1, rows, 32), np.ones((32, 32), np.float32)), target=AVX512, tuning="off")
    assert art.report()["dense"]["padded_rows"] == -(-rows // ROW_TILE_MAX) * ROW_TILE_MAX - rows


@pytest.mark.parametrize("columns, lanes, registers, tile", [
    (768, 16, 32, Tile(8, 3)), (1024, 16, 32, Tile(6, 4)), (32, 16, 32, Tile(8, 2)), (16, 16, 32, Tile(8, 1)),
    (50257, 16, 32, Tile(8, 3)), (100, 16, 32, Tile(8, 1)), (768, 8, 16, Tile(4, 3)), (1024, 8, 16, Tile(6, 2))])
def test_register_tile_fits_the_registers_and_pads_little(columns, lanes, registers, tile):
    """Wide panels where N allows (AVX-512: 24 of 32 registers accumulate, AVX2: 12 of 16); an N
    that no preferred panel divides within 3 % gets the one that pads least."""
    assert register_tile(columns, lanes, registers) == tile


@pytest.mark.parametrize("rows, packed", [(8, 1), (1, 0)])
def test_columns_no_panel_divides_and_single_rows(rows, packed):
    """Padded with zero columns (a vocabulary projection); a single-row product (a classifier head)
    stays unpacked: it reads each weight once in any layout."""
    weight = np.random.default_rng(3).standard_normal((16, 1000)).astype(np.float32)
    model = _matmul_model((1, rows, 16), weight, bias=True)
    art = relaxc.compile(model, target="cpu", tuning="off")
    assert art.report()["dense"]["packed"] == packed and art.report()["dense"]["unpacked"] == 1 - packed
    target = targets.resolve("cpu")
    lanes = targets.vector_lanes(target)
    panel = register_tile(1000, lanes, targets.vector_registers(target)).vectors * lanes
    assert art.report()["dense"]["padded_columns"] == (-(-1000 // panel) * panel - 1000) * packed
    x = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


@pytest.mark.parametrize("columns", [1001, 997])
def test_a_single_row_product_no_vector_divides_is_padded_to_whole_vectors(columns):
    """Else each column is a scalar walk down the weight (a 21,841-class head took 40 ms)."""
    weight = np.random.default_rng(5).standard_normal((64, columns)).astype(np.float32)
    model = _matmul_model((1, 64), weight, bias=True)
    art = relaxc.compile(model, target="cpu", tuning="off")
    lanes = targets.vector_lanes(targets.resolve("cpu"))
    assert art.report()["dense"]["padded_columns"] == -(-columns // lanes) * lanes - columns
    product = next(f for gv, f in art.module("final").functions.items() if "matmul" in gv.name_hint)
    assert "T.vectorized" in product.script()
    x = reference.random_inputs(art.inputs, seed=4)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


def test_attention_products_of_awkward_sizes_are_padded_and_correct():
    """Scores (q @ k^T) and context (p @ v) for ViT's 197 tokens."""
    tokens, width = 197, 64
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["out"])]
    shape = [1, 3, tokens, width]
    model = reference._model(nodes, [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"],
                             [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)], [])
    art = relaxc.compile(model, target="cpu", tuning="off", validate_memory=True)
    assert art.report()["dense"]["padded_matmuls"] >= 1
    assert art.report()["schedules"].get("rows", 0) >= 1  # the softmax
    x = reference.random_inputs(art.inputs, seed=2)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


def test_a_dense_layer_over_a_dynamic_batch_runs_each_panel_over_every_batch():
    """Rows of batch x sequence, one weight: the parallel loop takes panels outermost, so each
    panel is read once for every batch's rows (batch outermost it was read once per batch), and
    the result is right at every size."""
    weight = np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32)
    model = _matmul_model(("batch", "sequence", 64), weight, bias=True)
    art = relaxc.compile(model, tuning="off", dim_bounds={"batch": 8, "sequence": 40})
    (kernel,) = [f for gv, f in art.module().functions_items() if "dense_packed" in gv.name_hint]
    realizes = []
    tvm_ffi.structural_map(kernel.body, [(tvm.s_tir.SBlockRealize, lambda r: realizes.append(r) or r)])
    (update,) = [r for r in realizes if r.block.name_hint == "dense_packed_update"]
    assert isinstance(update.iter_values[0], tvm.tirx.FloorMod), update.iter_values[0]  # batch: fused % batch
    for batch, sequence in ((1, 1), (3, 17), (8, 40)):
        x = {"x": np.random.default_rng(batch).standard_normal((batch, sequence, 64)).astype(np.float32)}
        reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))
