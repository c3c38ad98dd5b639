"""Quantized models in QOperator form (QLinearConv, QLinearMatMul, QGemm, com.microsoft's QLinear ops):
written in QDQ form on import, run on the integers, equal to onnxruntime's int8 to the bit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import relaxc
from relaxc.benchmarks.quantized import with_quantized_outputs
from relaxc.frontend import qoperators
from relaxc.support.errors import UnsupportedOperatorError
from tests import reference
from tests.test_quantized import _float_cnn

pytest.importorskip("onnxruntime.quantization", reason="onnxruntime's quantization tool makes the QOperator models")

from relaxc.benchmarks.quantized import quantize  # noqa: E402


def _mixed(seed: int = 0) -> onnx.ModelProto:
    """Conv + LeakyReLU, average and max pooling concatenated, a matmul by constant weights and a
    softmax: QuantizeLinear, QLinearConv, QLinearLeakyRelu, QLinearAveragePool, QLinearConcat,
    QLinearMatMul and QLinearSoftmax in QOperator form."""
    rng = np.random.default_rng(seed)
    inits = [reference._const("w", rng.standard_normal((8, 4, 3, 3)) * 0.3),
             reference._const("m", rng.standard_normal((16, 12)) * 0.3),
             numpy_helper.from_array(np.array([1, 16, 16], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("LeakyRelu", ["c"], ["l"], alpha=0.1),
             helper.make_node("AveragePool", ["l"], ["a"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("MaxPool", ["l"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Concat", ["a", "p"], ["cat"], axis=1),
             helper.make_node("Reshape", ["cat", "shape"], ["r"]),
             helper.make_node("MatMul", ["r", "m"], ["mm"]),
             helper.make_node("Softmax", ["mm"], ["y"], axis=-1)]
    return reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 12])], inits)


@pytest.mark.parametrize("make, ops", [
    (_float_cnn, {"QLinearConv", "QLinearAdd", "QLinearSigmoid", "QLinearMul", "QLinearGlobalAveragePool", "QGemm"}),
    (_mixed, {"QLinearConv", "QLinearLeakyRelu", "QLinearAveragePool", "QLinearConcat", "QLinearMatMul",
              "QLinearSoftmax"})], ids=["cnn", "mixed"])
def test_qoperator_models_equal_onnxruntime_int8_to_the_bit(make, ops):
    model = quantize(make(), form="QOperator")
    assert ops <= {node.op_type for node in model.graph.node}
    model = with_quantized_outputs(model)
    art = relaxc.compile(model, tuning="off", backends="off")
    summary = art.report()["quantized"]
    assert summary["float"] == {} and summary["requantized"] == sum(
        node.op_type in ("QLinearConv", "QLinearMatMul", "QGemm") for node in model.graph.node)
    session = reference.ort_session(model)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        for name, got, want in zip([v.name for v in model.graph.output], art.run(x), session.run(None, {"x": x})):
            assert got.dtype == want.dtype and got.shape == want.shape, name
            np.testing.assert_array_equal(got, want, err_msg=name)


def test_a_qoperator_form_without_a_qdq_chain_is_refused_by_name():
    """Channels-last pooling (onnxruntime's own layout pass writes it) has no QDQ chain here."""
    constants = {"s": np.float32(0.1), "z": np.uint8(3)}
    node = helper.make_node("QLinearGlobalAveragePool", ["x", "s", "z", "s", "z"], ["y"], name="gap",
                            domain=qoperators.MICROSOFT, channels_last=1)
    graph = helper.make_graph([node], "gap", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 1, 1, 8])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(qoperators.MICROSOFT, 1)])
    model.ir_version = reference.ORT_MAX_IR_VERSION
    with pytest.raises(UnsupportedOperatorError, match="com.microsoft::QLinearGlobalAveragePool.*gap"):
        relaxc.compile(model, tuning="off", backends="off")
