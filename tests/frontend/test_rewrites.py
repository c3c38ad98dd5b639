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
