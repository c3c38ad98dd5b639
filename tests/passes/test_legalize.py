"""passes/legalize.py: the operators TVM 0.27 does not legalise, against onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import relaxc
from relaxc.support.errors import UserError
from tests import reference


@pytest.mark.parametrize("axis, exclusive, dtype", [(1, 0, TensorProto.INT64), (-1, 1, TensorProto.FLOAT),
                                                    (0, 0, TensorProto.FLOAT)])
def test_cumsum(axis, exclusive, dtype):
    """RoBERTa's position ids are a cumsum of the attention mask."""
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["out"], exclusive=exclusive)]
    shape = [3, 77]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", dtype, shape)],
                             [helper.make_tensor_value_info("out", dtype, shape)],
                             [numpy_helper.from_array(np.array(axis, np.int64), "axis")])
    art = relaxc.compile(model, target="cpu", tuning="off")
    x = reference.random_inputs(art.inputs, seed=1)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("transform", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("shape, size", [((1, 5, 14, 14), (1, 5, 56, 56)),  # DeepLabV3's upsampling, smaller
                                         ((2, 3, 7, 9), (2, 3, 12, 4)),  # batch, down- and upsampling, non-square
                                         ((1, 4, 1, 6), (1, 4, 5, 12)),  # a single row: TVM's 2-D form
                                         ((1, 4, 10, 8), (1, 4, 1, 8))])  # to a single row: row 0 or the middle
def test_resize_runs_in_two_passes_where_it_can(mode, transform, shape, size):
    nodes = [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode,
                              coordinate_transformation_mode=transform)]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(size))],
                             [numpy_helper.from_array(np.array(size, np.int64), "sizes")], opset=18)
    if transform == "align_corners" and min(size[2:]) == 1:  # ONNX divides by size - 1: refused
        with pytest.raises(UserError, match="align_corners"):
            relaxc.compile(model, target="cpu", tuning="off")
        return
    art = relaxc.compile(model, target="cpu", tuning="off")
    separable = "resize_width" in art.ir("legalize")
    assert separable == (min(shape[2:]) > 1)
    x = reference.random_inputs(art.inputs, seed=2)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


@pytest.mark.parametrize("op, fill", [("ReduceMax", -np.inf), ("ReduceMin", np.inf)])
def test_max_and_min_of_infinities_are_infinite(op, fill):
    """TOPI's max starts from the lowest finite float: the max of a row of -inf was -3.4e38, and an
    attention's ``max == -inf`` test of a fully masked row never held."""
    nodes = [helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
                             [numpy_helper.from_array(np.array([1], np.int64), "axes")], opset=18)
    art = relaxc.compile(model, target="cpu", tuning="off")
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    x[1] = fill
    x[2, 3] = fill
    expected = x.max(axis=1) if op == "ReduceMax" else x.min(axis=1)
    np.testing.assert_array_equal(art.run(x)[0], expected)


@pytest.mark.parametrize("epsilon", [1e-5, 1e-12])
def test_layer_norm_of_equal_values_is_its_bias(epsilon):
    """A row of equal values has variance 0: the output is exactly the bias, as onnxruntime gives it
    (the mean's rounding, times 1 / sqrt(epsilon), moved it by 0.5 % before)."""
    shape = [2, 25, 31]
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.uniform(0.5, 1.5, 31).astype(np.float32), "scale"),
               numpy_helper.from_array(rng.standard_normal(31).astype(np.float32), "bias")]
    nodes = [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], axis=-1, epsilon=epsilon)]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], weights, opset=17)
    art = relaxc.compile(model, target="cpu", tuning="off")
    x = rng.standard_normal(shape).astype(np.float32)
    x[0] = rng.standard_normal((25, 1)).astype(np.float32) * 7  # rows of one value each
    out = art.run({"x": x})[0]
    assert np.array_equal(out[0], np.broadcast_to(numpy_helper.to_array(weights[1]), (25, 31)))
    reference.assert_matches([out], reference.ort_run(model, {"x": x}))


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("axis", [-1, 1])
def test_topk_both_outputs(largest, axis):
    """A classifier's top-5 (values and indices): TVM 0.27 legalises no ``topk`` (code generation
    crashed on it); the runtime's sort does it on CPUs."""
    shape = [2, 50, 7] if axis == 1 else [3, 1000]
    out = list(shape)
    out[axis] = 5
    nodes = [helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=axis, largest=largest)]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                             [helper.make_tensor_value_info("values", TensorProto.FLOAT, out),
                              helper.make_tensor_value_info("indices", TensorProto.INT64, out)],
                             [numpy_helper.from_array(np.array([5], np.int64), "k")])
    art = relaxc.compile(model, target="cpu", tuning="off")
    x = reference.random_inputs(art.inputs, seed=3)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


def test_topk_of_a_type_the_runtime_cannot_sort_is_refused_by_name():
    nodes = [helper.make_node("TopK", ["x", "k"], ["values", "indices"])]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.UINT64, [3, 8])],
                             [helper.make_tensor_value_info("values", TensorProto.UINT64, [3, 2]),
                              helper.make_tensor_value_info("indices", TensorProto.INT64, [3, 2])],
                             [numpy_helper.from_array(np.array([2], np.int64), "k")])
    with pytest.raises(UserError, match="topk of uint64"):
        relaxc.compile(model, target="cpu", tuning="off")


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint8])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift_by_any_amount(dtype, direction):
    """Out-of-range amounts (negative, the bit width or more) shift every bit out: 0, or the sign for
    a signed right shift. TOPI left them to LLVM (poison: int8 shifted modulo 8)."""
    bits = np.iinfo(dtype).bits
    amounts = [0, 1, 3, bits - 1, bits, bits + 1, np.iinfo(dtype).max] + ([-1, -bits] if np.iinfo(dtype).min else [])
    x = np.array([-8, 5, -1, 100, -128, 3, 7, -77, 64][:len(amounts)]).astype(dtype)
    y = np.array(amounts, dtype)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = reference._model([helper.make_node("BitShift", ["x", "y"], ["out"], direction=direction)],
                             [helper.make_tensor_value_info(n, elem, [len(amounts)]) for n in ("x", "y")],
                             [helper.make_tensor_value_info("out", elem, [len(amounts)])], [])
    wide, shift = x.astype(np.int64), y.astype(np.int64)
    in_range = (shift >= 0) & (shift < bits)
    if direction == "LEFT":
        want = np.where(in_range, (wide << np.clip(shift, 0, bits - 1)), 0).astype(dtype)  # wraps to the type
    else:
        fill = np.where(wide < 0, -1, 0)
        want = np.where(in_range, wide >> np.clip(shift, 0, bits - 1), fill).astype(dtype)
    art = relaxc.compile(model, target="cpu", tuning="off")
    np.testing.assert_array_equal(art.run({"x": x, "y": y})[0], want)


@pytest.mark.parametrize("amount_shape", [(4,), (), (3, 1)])
def test_bit_shift_broadcasts_its_amount(amount_shape):
    """An amount of another shape broadcasts, as ONNX's BitShift does (a scalar shift of a tensor)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (3, 4)).astype(np.uint8)
    y = rng.integers(0, 8, amount_shape).astype(np.uint8)
    model = reference._model([helper.make_node("BitShift", ["x", "y"], ["out"], direction="RIGHT")],
                             [helper.make_tensor_value_info("x", TensorProto.UINT8, [3, 4]),
                              helper.make_tensor_value_info("y", TensorProto.UINT8, list(amount_shape))],
                             [helper.make_tensor_value_info("out", TensorProto.UINT8, [3, 4])], [])
    art = relaxc.compile(model, target="cpu", tuning="off")
    np.testing.assert_array_equal(art.run({"x": x, "y": y})[0], x >> y)
