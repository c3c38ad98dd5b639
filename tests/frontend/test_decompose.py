"""compiler/frontend/decompose.py: LSTM, GRU, RNN and Col2Im written as standard nodes, against
onnxruntime's own kernels for them; forms outside what it writes out are refused by name."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import relaxc
from relaxc.support.errors import UnsupportedOperatorError
from tests import reference

SEQ, BATCH, INPUT, HIDDEN = 5, 3, 6, 4


def _recurrent(op: str, direction: str = "forward", layout: int = 0, peepholes: bool = False,
               **attrs) -> object:
    rng = np.random.default_rng(11)
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    directions = 2 if direction == "bidirectional" else 1
    weights = {"w": (directions, gates * HIDDEN, INPUT), "r": (directions, gates * HIDDEN, HIDDEN),
               "b": (directions, 2 * gates * HIDDEN)}
    if peepholes:
        weights["p"] = (directions, 3 * HIDDEN)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32), name)
             for name, shape in weights.items()]
    x_shape = [BATCH, SEQ, INPUT] if layout else [SEQ, BATCH, INPUT]
    state_shape = [BATCH, directions, HIDDEN] if layout else [directions, BATCH, HIDDEN]
    y_shape = [BATCH, SEQ, directions, HIDDEN] if layout else [SEQ, directions, BATCH, HIDDEN]
    inputs = ["x", "w", "r", "b", "", "h0"] + (["c0", "p" if peepholes else ""] if op == "LSTM" else [])
    outputs = ["y", "y_h"] + (["y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, inputs, outputs, hidden_size=HIDDEN, direction=direction, layout=layout, **attrs)
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape),
                    helper.make_tensor_value_info("h0", TensorProto.FLOAT, state_shape)]
    if op == "LSTM":
        graph_inputs.append(helper.make_tensor_value_info("c0", TensorProto.FLOAT, state_shape))
    graph_outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, y_shape if o == "y" else state_shape)
                     for o in outputs]
    return reference._model([node], graph_inputs, graph_outputs, inits, 18)


def _matches(model, seed: int = 3) -> object:
    """onnxruntime's results, or onnx.reference's for what onnxruntime lacks (batch-first layouts)."""
    art = relaxc.compile(model, tuning="off")
    x = reference.random_inputs(art.inputs, seed=seed)
    if any(a.name == "layout" and a.i == 1 for a in model.graph.node[0].attribute):
        expected = ReferenceEvaluator(model).run(None, x)
    else:
        expected = reference.ort_run(model, x)
    reference.assert_matches(reference.relaxc_run(art, x), expected)
    return art


@pytest.mark.parametrize("direction, layout", [("forward", 0), ("bidirectional", 0), ("reverse", 1),
                                               ("bidirectional", 1)])
def test_lstm_matches_onnxruntime(direction, layout):
    _matches(_recurrent("LSTM", direction, layout))


def test_lstm_with_peepholes_and_clip_matches_onnxruntime():
    _matches(_recurrent("LSTM", "bidirectional", peepholes=True, clip=1.5))


@pytest.mark.parametrize("linear_before_reset", [0, 1])  # torch exports 1
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_gru_matches_onnxruntime(direction, linear_before_reset):
    _matches(_recurrent("GRU", direction, linear_before_reset=linear_before_reset))


def test_rnn_with_another_activation_matches_onnxruntime():
    _matches(_recurrent("RNN", "bidirectional", activations=["Relu", "Relu"]))


def test_the_input_projection_is_one_matmul_per_direction_on_packed_weights():
    """The whole sequence's input projection and each step's recurrent product are constant-weight
    matmuls: the dense pass packs them (the slices and transposes of the weights folded away)."""
    art = _matches(_recurrent("LSTM", "bidirectional"))
    assert art.report()["dense"]["packed"] >= 2


def test_an_activation_with_parameters_is_refused_by_name():
    model = _recurrent("RNN", activations=["LeakyRelu"], activation_alpha=[0.1])
    with pytest.raises(UnsupportedOperatorError, match="RNN"):
        relaxc.compile(model, tuning="off", backends="off")


@pytest.mark.parametrize("size, kernel, strides, pads, dilations", [
    ((6, 7), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # VOLO's fold: 3 x 3, padding 1
    ((9, 8), (2, 3), (2, 1), (0, 1, 1, 0), (1, 2))])
def test_col2im_matches_onnxruntime(size, kernel, strides, pads, dilations):
    channels = 4
    rows, columns = ((size[i] + pads[i] + pads[i + 2] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
                     for i in range(2))
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["out"], strides=list(strides), pads=list(pads),
                            dilations=list(dilations))
    model = reference._model(
        [node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, channels * kernel[0] * kernel[1],
                                                                       rows * columns])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, channels, *size])],
        [numpy_helper.from_array(np.array(size, np.int64), "image"),
         numpy_helper.from_array(np.array(kernel, np.int64), "block")], 18)
    _matches(model)
