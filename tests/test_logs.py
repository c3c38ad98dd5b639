"""relaxc prints only its own messages: TVM's log is captured, translated, and kept in the report."""

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relaxc.runtime import diagnostics
from relaxc.support import tvm_log
from tests.helpers import ROOT, env, run_cli


def _gather_pow_model(path) -> None:
    """Token embedding, cube, tanh: the Gather and Pow TVM warns about while compiling GPT-2."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"], axis=0),
             helper.make_node("Pow", ["e", "three"], ["p"]),
             helper.make_node("Tanh", ["p"], ["y"])]
    graph = helper.make_graph(nodes, "gather_pow", [helper.make_tensor_value_info("ids", TensorProto.INT64, (1, 8))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, 16))],
                              [numpy_helper.from_array(rng.standard_normal((100, 16)).astype(np.float32), "emb"),
                               numpy_helper.from_array(np.array(3.0, np.float32), "three")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def _decoder_block(path, seq: int = 8, hidden: int = 32, heads: int = 4, vocab: int = 50) -> None:
    """A GPT-2-style decoder block as the exporter writes it: token and position embeddings
    (Gather), LayerNorm, fused QKV MatMul and Split, heads by Reshape/Transpose, a causal mask by
    Where, softmax, tanh GELU with Pow 3."""
    rng = np.random.default_rng(1)
    head = hidden // heads
    w = lambda name, *shape: numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)  # noqa: E731
    c = lambda name, value, dtype=np.float32: numpy_helper.from_array(np.asarray(value, dtype), name)  # noqa: E731
    node = helper.make_node
    nodes = [
        node("Gather", ["wte", "ids"], ["tok"], axis=0), node("Add", ["tok", "wpe"], ["h"]),
        node("LayerNormalization", ["h", "ln_g", "ln_b"], ["ln"], axis=-1),
        node("MatMul", ["ln", "w_qkv"], ["qkv"]), node("Split", ["qkv", "split"], ["q", "k", "v"], axis=-1),
        *[n for name in "qkv" for n in (
            node("Reshape", [name, "heads_shape"], [f"{name}_r"]),
            node("Transpose", [f"{name}_r"], [f"{name}_h"], perm=[0, 2, 1, 3]))],
        node("Transpose", ["k_h"], ["k_t"], perm=[0, 1, 3, 2]), node("MatMul", ["q_h", "k_t"], ["s"]),
        node("Div", ["s", "scale"], ["s2"]), node("Where", ["causal", "s2", "neg"], ["masked"]),
        node("Softmax", ["masked"], ["p"], axis=-1), node("MatMul", ["p", "v_h"], ["ctx"]),
        node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]), node("Reshape", ["ctx_t", "merge"], ["att"]),
        node("Add", ["h", "att"], ["h2"]), node("MatMul", ["h2", "w_fc"], ["f"]),
        node("Pow", ["f", "three"], ["f3"]), node("Mul", ["f3", "k044"], ["f3c"]), node("Add", ["f", "f3c"], ["inner"]),
        node("Mul", ["inner", "sqrt2pi"], ["inner2"]), node("Tanh", ["inner2"], ["t"]), node("Add", ["t", "one"], ["t1"]),
        node("Mul", ["f", "t1"], ["g0"]), node("Mul", ["g0", "half"], ["gelu"]), node("MatMul", ["gelu", "w_out"], ["y"]),
    ]
    inits = [w("wte", vocab, hidden), w("wpe", seq, hidden), c("ln_g", np.ones(hidden)), c("ln_b", np.zeros(hidden)),
             w("w_qkv", hidden, 3 * hidden), c("split", [hidden] * 3, np.int64),
             c("heads_shape", [1, seq, heads, head], np.int64), c("scale", np.sqrt(head)),
             c("causal", np.tril(np.ones((seq, seq), bool)), bool), c("neg", -1e9),
             c("merge", [1, seq, hidden], np.int64), w("w_fc", hidden, 4 * hidden), c("three", 3.0),
             c("k044", 0.044715), c("sqrt2pi", np.sqrt(2 / np.pi)), c("one", 1.0), c("half", 0.5),
             w("w_out", 4 * hidden, hidden)]
    graph = helper.make_graph(nodes, "decoder_block", [helper.make_tensor_value_info("ids", TensorProto.INT64, (1, seq))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, seq, hidden))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def test_decoder_block_compiles_quietly_and_matches(tmp_path):
    from tests import reference

    _decoder_block(tmp_path / "block.onnx")
    code = ("import sys, numpy as np, relaxc; art = relaxc.compile(sys.argv[1]); "
            "np.save(sys.argv[2], art.run({'ids': np.arange(8).reshape(1, 8) % 50})[0])")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "block.onnx"), str(tmp_path / "y.npy")],
                          capture_output=True, text=True, cwd=ROOT, timeout=600, env=env())
    assert proc.returncode == 0, proc.stderr
    assert _tvm_lines(proc.stderr) == [], proc.stderr
    expected = reference.ort_run(onnx.load(tmp_path / "block.onnx"), {"ids": np.arange(8).reshape(1, 8) % 50})
    reference.assert_matches([np.load(tmp_path / "y.npy")], expected)


COMPILE_EXPORT_LOAD = """
import json, sys
import relaxc
art = relaxc.compile(sys.argv[1])
art.export(sys.argv[2])
relaxc.load(sys.argv[2]).run({"ids": __import__("numpy").arange(8).reshape(1, 8)})
print(json.dumps(art.report()))
"""


def _tvm_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if tvm_log.TVM_LINE.match(line)]


@pytest.mark.slow
def test_relaxc_run_resnet50_prints_no_tvm_line():
    proc = run_cli("run", "onnx:resnet50", "--repeat", "1")
    assert proc.returncode == 0, proc.stderr
    assert _tvm_lines(proc.stderr + proc.stdout) == []
    assert "[relaxc] build" in proc.stderr  # relaxc's own progress still shows


@pytest.mark.parametrize("debug", [False, True])
def test_compile_export_load_are_quiet_and_warnings_reach_the_report(tmp_path, debug):
    import json

    _gather_pow_model(tmp_path / "m.onnx")
    proc = subprocess.run([sys.executable, "-c", COMPILE_EXPORT_LOAD, str(tmp_path / "m.onnx"), str(tmp_path / "m.so")],
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**env(), "RELAXC_LOG": "debug" if debug else ""})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    if debug:  # TVM's own lines too, and the report is the same
        assert any("Detected pow" in line for line in _tvm_lines(proc.stderr))
        assert any("Scope Loaded" in line for line in _tvm_lines(proc.stderr))
    else:
        assert _tvm_lines(proc.stderr) == [], proc.stderr
    assert report["warnings"] == []  # take's "fast mode" warning is internal: every index is checked
    assert any("Fast mode segfaults" in m["message"] for m in report["tvm_log"])
    assert any("Detected pow" in m["message"] and m["count"] >= 1 for m in report["tvm_log"])


def test_capture_sorts_tvm_lines_from_other_output(capfd):
    with tvm_log.captured() as said:
        os.write(2, b"[12:00:00] /project/src/x.cc:12: Warning: first\n  continued\n")
        os.write(2, b"not TVM\n  indented, not TVM either\n")
    assert said.messages == [("Warning", "first\n  continued")]
    assert capfd.readouterr().err == "not TVM\n  indented, not TVM either\n"


def test_an_unknown_tvm_warning_is_reported_not_hidden():
    said = tvm_log.Capture([("Warning", "Scope Loaded: x"), ("Warning", "something new"),
                            ("Warning", "something new"), ("Info", "chatter")])
    warnings, log = diagnostics.translate(said)
    assert warnings == ["TVM (warning): something new"]
    assert {"level": "Warning", "message": "something new", "count": 2} in log
