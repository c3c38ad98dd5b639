"""Test models, the onnxruntime reference with the project's tolerance, and transformers' tokens for
the zoo's TorchScript decoders.

The reference, the tolerance and random weights for the bundled models live in
``benchmarks/reference.py`` (the benchmarks use them too), the random inputs in ``compiler.runtime``;
they are re-exported here.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from relaxc.benchmarks.reference import (ORT_MAX_IR_VERSION, OrtDecoder, assert_matches, ort_greedy,  # noqa: F401
                                         ort_run, ort_session, randomize_weights, teacher_forced)  # noqa: F401
from relaxc.frontend import models
from relaxc.runtime.runner import random_inputs  # noqa: F401

TRANSFORMERS_TIE = 1e-4  # of max|logit|: a first difference where transformers' top two are this close is a tie


def assert_relaxc_ran(art) -> None:
    """Fails unless relaxc's own kernels run the whole of ``art``: no subgraph on another runtime."""
    elsewhere = [f"{sub['backend']} ran {sub['nodes']} node(s) ({', '.join(sorted(set(sub['ops'])))})"
                 for sub in art.report()["backends"]["subgraphs"]]
    assert not elsewhere, f"not relaxc's kernels: {'; '.join(elsewhere)}"


def relaxc_run(art, inputs) -> list[np.ndarray]:
    """``art.run(inputs)``, after checking that relaxc's kernels ran all of it: what a comparison
    with onnxruntime compares."""
    assert_relaxc_ran(art)
    return art.run(inputs)


def _const(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(array.astype(np.float32), name)


def _model(nodes: list, inputs: list, outputs: list, initializers: list, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ORT_MAX_IR_VERSION
    onnx.checker.check_model(model)
    return model


def small_cnn(seed: int = 0) -> onnx.ModelProto:
    """Conv(3->20)+BN+ReLU, MaxPool, residual block (20->20), GlobalAvgPool, Flatten, Gemm, Softmax."""
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.standard_normal(s) * np.sqrt(2.0 / np.prod(s[1:]))  # noqa: E731
    inits = [
        _const("w1", w(20, 3, 3, 3)), _const("b1", rng.standard_normal(20) * 0.1),
        _const("g", rng.uniform(0.5, 1.5, 20)), _const("beta", rng.standard_normal(20) * 0.1),
        _const("mean", rng.standard_normal(20) * 0.1), _const("var", rng.uniform(0.5, 1.5, 20)),
        _const("w2", w(20, 20, 3, 3)), _const("w3", w(20, 20, 1, 1)), _const("b3", rng.standard_normal(20) * 0.1),
        _const("fc", w(10, 20)), _const("fcb", rng.standard_normal(10) * 0.1),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "g", "beta", "mean", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"]),
        helper.make_node("Add", ["c3", "p1"], ["res"]),
        helper.make_node("Relu", ["res"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc", "fcb"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=1),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)


def branchy_cnn(seed: int = 1) -> onnx.ModelProto:
    """Odd channel counts (44, 92), Clip, depthwise and grouped convs, swish, concat, avg pool, channel softmax."""
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.standard_normal(s) * np.sqrt(2.0 / np.prod(s[1:]))  # noqa: E731
    inits = [
        _const("w1", w(44, 3, 3, 3)), _const("wd", w(44, 1, 3, 3)), _const("bd", rng.standard_normal(44) * 0.1),
        _const("wg", w(48, 11, 1, 1)), _const("w2", w(92, 92, 1, 1)),
        _const("lo", np.array(0.0)), _const("hi", np.array(6.0)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["a1"]),
        helper.make_node("Conv", ["a1", "wd", "bd"], ["dw"], pads=[1, 1, 1, 1], group=44),
        helper.make_node("Sigmoid", ["dw"], ["s"]),
        helper.make_node("Mul", ["dw", "s"], ["swish"]),
        helper.make_node("Conv", ["swish", "wg"], ["g"], group=4),
        helper.make_node("Concat", ["a1", "g"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "w2"], ["c2"]),
        helper.make_node("AveragePool", ["c2"], ["p"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
        helper.make_node("Softmax", ["p"], ["y"], axis=1),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 30, 30])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 92, 15, 15])], inits)


def blocked_paths_cnn(seed: int = 2) -> onnx.ModelProto:
    """Ops that stay blocked: grouped conv on whole blocks, concat of unpadded blocked tensors, per-channel
    Mul/Div/Sub by constants, Sigmoid, MaxPool with padding, GlobalAveragePool, plus a 20-channel
    (padded) branch added to a blocked one and a channel softmax at the end."""
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.standard_normal(s) * np.sqrt(2.0 / np.prod(s[1:]))  # noqa: E731
    inits = [
        _const("w1", w(32, 3, 3, 3)), _const("wg", w(32, 16, 3, 3)), _const("w20", w(20, 32, 1, 1)),
        _const("w20b", w(20, 20, 3, 3)), _const("wc", w(16, 52, 1, 1)),
        _const("scale", rng.uniform(0.5, 1.5, (32, 1, 1))), _const("div", rng.uniform(0.5, 2.0, (1, 32, 1, 1))),
        _const("shift", rng.standard_normal((1, 32, 1, 1)) * 0.1),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c1", "scale"], ["m"]),
        helper.make_node("Div", ["m", "div"], ["d"]),
        helper.make_node("Sub", ["d", "shift"], ["s"]),
        helper.make_node("Sigmoid", ["s"], ["sg"]),
        helper.make_node("Conv", ["sg", "wg"], ["g"], pads=[1, 1, 1, 1], group=2),
        helper.make_node("Relu", ["g"], ["r"]),
        helper.make_node("Conv", ["r", "w20"], ["c20"]),
        helper.make_node("Conv", ["c20", "w20b"], ["c20b"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c20", "c20b"], ["a20"]),
        helper.make_node("Concat", ["r", "a20"], ["cat"], axis=1),
        helper.make_node("MaxPool", ["cat"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p", "wc"], ["c"]),
        helper.make_node("Concat", ["c", "c"], ["cc"], axis=1),
        helper.make_node("GlobalAveragePool", ["cc"], ["gap"]),
        helper.make_node("Softmax", ["gap"], ["y"], axis=1),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 17, 17])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 1, 1])], inits)


def conv3x3(channels: int, out_channels: int, height: int, width: int, pads: int, batch: int = 1,
          residual: bool = False, seed: int = 0) -> onnx.ModelProto:
    """Conv 3x3 stride 1 + bias + ReLU (and a residual add of the input when the shapes allow)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((out_channels, channels, 3, 3)) / np.sqrt(9 * channels)).astype(np.float32)
    b = rng.standard_normal(out_channels).astype(np.float32)
    out_h, out_w = height + 2 * pads - 2, width + 2 * pads - 2
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pads] * 4)]
    if residual:
        nodes.append(helper.make_node("Add", ["c", "x"], ["s"]))
    nodes.append(helper.make_node("Relu", ["s" if residual else "c"], ["y"]))
    return _model(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, channels, height, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, out_channels, out_h, out_w])],
        [_const("w", w), _const("b", b)])


def transformers_fixtures() -> list[str]:
    """The decoders with transformers' greedy tokens beside them (``benchmarks/decoder_fixtures.py``)."""
    zoo = os.path.dirname(models.bundled_path("zoo:gpt2_past"))
    return sorted(os.path.basename(p).split(".")[0] for p in glob.glob(os.path.join(zoo, "*.generate.json")))


def assert_generates_as_transformers(art, name: str) -> None:
    """``art`` (zoo:``name`` compiled with room for the fixture's prompts) generates transformers' greedy
    tokens for a prompt alone and for a left-padded batch of three lengths: equal, or a first difference
    where transformers' own top two tie within ``TRANSFORMERS_TIE``."""
    path = os.path.join(os.path.dirname(models.bundled_path(f"zoo:{name}")), f"{name}.generate.json")
    with open(path, encoding="utf-8") as file:
        fixture = json.load(file)
    new, prompts = fixture["new_tokens"], fixture["prompts"]
    for case, mask in (("single", None), ("batch", prompts["mask"])):
        ids = np.array(prompts[case])
        got = art.generate(ids, None if mask is None else np.array(mask), max_new_tokens=new)[:, ids.shape[1]:]
        for row, (ours, theirs, margin) in enumerate(zip(got, fixture[case]["tokens"], fixture[case]["margins"])):
            differs = np.nonzero(ours != np.asarray(theirs))[0]
            assert not differs.size or margin[int(differs[0])] <= TRANSFORMERS_TIE, \
                f"{name} {case} row {row} differs at new token {int(differs[0])}: {list(ours)} against {theirs}"

