"""compiler/frontend/functions.py: ONNX function operators expanded into ONNX's own bodies, checked against
onnx's reference evaluator (an independent implementation of the operators themselves)."""

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import relaxc
from relaxc import frontend
from relaxc.frontend import functions
from tests import reference


def _model(node, inputs, outputs, opset):
    return reference._model([node], [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs], [],
                            opset=opset)


def _check(model, feeds):
    art = relaxc.compile(model, target="cpu", tuning="off")
    expected = ReferenceEvaluator(model).run(None, feeds)
    got = art.run(*feeds.values())
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_standard_attention_is_expanded_not_given_to_the_importers_contrib_converter():
    """Opset 23's Attention (q, k, v, a boolean-free causal form): the importer's converter of that
    name implements com.microsoft's Attention and fails with KeyError 'num_heads'."""
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)
    shapes = [("q", [2, 4, 6, 8]), ("k", [2, 4, 6, 8]), ("v", [2, 4, 6, 8])]
    model = _model(node, shapes, [("y", [2, 4, 6, 8])], opset=23)
    expanded = functions.expand(model, frontend.converted_operators())
    assert "Attention" not in {n.op_type for n in expanded.graph.node}
    assert {"MatMul", "Softmax"} <= {n.op_type for n in expanded.graph.node}
    names = [n.name for n in expanded.graph.node]  # a slice of it goes to onnxruntime, which refuses repeats
    assert len(set(names)) == len(names)
    rng = np.random.default_rng(0)
    _check(model, {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes})


def test_loss_without_a_converter_is_expanded():
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"], reduction="mean")
    model = reference._model([node], [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [4, 5]),
                                      helper.make_tensor_value_info("labels", TensorProto.INT64, [4])],
                             [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], [], opset=18)
    rng = np.random.default_rng(1)
    _check(model, {"scores": rng.standard_normal((4, 5)).astype(np.float32),
                   "labels": rng.integers(0, 5, 4).astype(np.int64)})


@pytest.mark.parametrize("used", [True, False])
def test_layer_norm_is_expanded_only_when_its_statistics_are_read(used):
    outputs = ["y", "mean", "inv_std"] if used else ["y"]
    node = helper.make_node("LayerNormalization", ["x", "scale"], outputs, axis=-1)
    model = _model(node, [("x", [3, 8]), ("scale", [8])],
                   [("y", [3, 8])] + ([("mean", [3, 1]), ("inv_std", [3, 1])] if used else []), opset=18)
    expanded = functions.expand(model, frontend.converted_operators())
    assert ("LayerNormalization" in {n.op_type for n in expanded.graph.node}) != used
    rng = np.random.default_rng(2)
    _check(model, {"x": rng.standard_normal((3, 8)).astype(np.float32),
                   "scale": rng.standard_normal(8).astype(np.float32)})


def test_a_model_with_nothing_to_expand_is_returned_as_it_is():
    node = helper.make_node("Relu", ["x"], ["y"])
    model = _model(node, [("x", [4])], [("y", [4])], opset=18)
    assert functions.expand(model, frontend.converted_operators()) is model
