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
