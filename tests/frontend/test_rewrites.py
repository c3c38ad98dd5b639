"""compiler/frontend/rewrites.py: attributes the importer ignores, rewritten into forms it converts; checked
against onnx's reference evaluator and onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import relaxc
from tests import reference


@pytest.mark.parametrize("negative, positive", [(0, 1), (1, 0), (0, 0)])
def test_isinf_detect_flags(negative, positive):
    node = helper.make_node("IsInf", ["x"], ["y"], detect_negative=negative, detect_positive=positive)
    model = reference._model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                             [helper.make_tensor_value_info("y", TensorProto.BOOL, [6])], [], opset=18)
    x = np.array([np.inf, -np.inf, 0.0, np.nan, 3.0, -np.inf], np.float32)
    art = relaxc.compile(model, target="cpu", tuning="off")
    np.testing.assert_array_equal(art.run(x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0])


@pytest.mark.parametrize("auto_pad, output_shape", [("NOTSET", [10, 8]), ("SAME_UPPER", [9, 6]),
                                                    ("NOTSET", [8, 6])])
def test_conv_transpose_output_shape_becomes_pads(auto_pad, output_shape):
    """[10, 8]: one row beyond the last input's reach (output_padding); [8, 6]: cropped by pads."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((1, 2, 3, 3)).astype(np.float32), "w")
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[3, 2], output_shape=output_shape,
                            auto_pad=auto_pad)
    model = reference._model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 3, 3])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, *output_shape])], [w])
    x = rng.standard_normal((1, 1, 3, 3)).astype(np.float32)
    art = relaxc.compile(model, target="cpu", tuning="off")
    # onnxruntime: onnx's reference evaluator fails on an output_shape smaller than the full output
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, {"x": x}))


def test_space_to_depth_crd():
    """Opset 28's column-row-depth order; the importer only produces depth-column-row."""
    node = helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2, mode="CRD")
    model = reference._model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 6])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12, 2, 3])], [], opset=28)
    x = np.arange(72, dtype=np.float32).reshape(1, 3, 4, 6)
    art = relaxc.compile(model, target="cpu", tuning="off")
    np.testing.assert_array_equal(art.run(x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0])


def _model_with_dynamic_dims(nodes, inputs, outputs, initializers):
    value = lambda name, elem, shape: helper.make_tensor_value_info(name, elem, shape)  # noqa: E731
    return reference._model(nodes, [value(*i) for i in inputs], [value(*o) for o in outputs], initializers)


def test_a_slice_to_the_end_from_a_dynamic_start_ends_at_the_dim():
    """OPT's positions: ``cumsum(mask)[:, past:]``, its end INT64_MAX; the importer sized it ``INT64_MAX - past``."""
    i64 = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Shape", ["past"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["length"]),
             helper.make_node("Unsqueeze", ["length", "axes"], ["start"]),
             helper.make_node("Slice", ["x", "start", "end", "axes1"], ["y"])]
    model = _model_with_dynamic_dims(
        nodes, [("x", TensorProto.FLOAT, ["batch", "total"]), ("past", TensorProto.FLOAT, ["batch", "cached"])],
        [("y", TensorProto.FLOAT, ["batch", "new"])],
        [i64("one", 1), i64("axes", [0]), i64("end", [2 ** 63 - 1]), i64("axes1", [1])])
    art = relaxc.compile(model, target="cpu", tuning="off", dim_bounds={"batch": 2, "total": 16, "cached": 15})
    assert art.outputs[0][1] == ("batch", "total - cached")
    x, past = np.arange(20, dtype=np.float32).reshape(2, 10), np.zeros((2, 7), np.float32)
    np.testing.assert_array_equal(art.run(x, past)[0], x[:, 7:])


def test_a_range_from_a_dynamic_start_has_its_length_as_an_expression():
    """optimum's ``arange(past, past + sequence)``: the importer made its length a fresh size."""
    i64 = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Shape", ["past"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["start"]),
             helper.make_node("Shape", ["ids"], ["t"]), helper.make_node("Gather", ["t", "zero"], ["count"]),
             helper.make_node("Add", ["start", "count"], ["limit"]),
             helper.make_node("Range", ["start", "limit", "step"], ["positions"]),
             helper.make_node("Add", ["positions", "ids"], ["y"])]
    model = _model_with_dynamic_dims(
        nodes, [("past", TensorProto.FLOAT, ["cached"]), ("ids", TensorProto.INT64, ["sequence"])],
        [("y", TensorProto.INT64, ["sequence"])], [i64("zero", 0), i64("step", 1)])
    art = relaxc.compile(model, target="cpu", tuning="off", dim_bounds={"cached": 15, "sequence": 16})
    assert art.outputs[0][1] == ("sequence",)
    np.testing.assert_array_equal(art.run(np.zeros(5, np.float32), np.array([10, 20, 30]))[0], [15, 26, 37])
