"""passes/legalize.py: the operators TVM 0.27 does not legalise, against onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
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
    art = compiler.compile(model, target="cpu", tuning="off")
    x = reference.random_inputs(art.inputs, seed=1)
    reference.assert_matches(art.run(x), reference.ort_run(model, x))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("transform", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("shape, size", [((1, 5, 14, 14), (1, 5, 56, 56)),  # DeepLabV3's upsampling, smaller
                                         ((2, 3, 7, 9), (2, 3, 12, 4)),  # batch, down- and upsampling, non-square
                                         ((1, 4, 1, 6), (1, 4, 5, 12))])  # a single row: TVM's 2-D form
def test_resize_runs_in_two_passes_where_it_can(mode, transform, shape, size):
    nodes = [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode,
                              coordinate_transformation_mode=transform)]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(size))],
                             [numpy_helper.from_array(np.array(size, np.int64), "sizes")], opset=18)
    art = compiler.compile(model, target="cpu", tuning="off")
    separable = "resize_width" in art.ir("legalize")
    assert separable == (min(shape[2:]) > 1)
    x = reference.random_inputs(art.inputs, seed=2)
    reference.assert_matches(art.run(x), reference.ort_run(model, x))
