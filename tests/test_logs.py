"""relaxc prints only its own messages: TVM's log is captured, translated, and kept in the report."""

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler import diagnostics
from support import tvm_log
from tests.helpers import ROOT, env, relaxc


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


COMPILE_EXPORT_LOAD = """
import json, sys
import compiler
art = compiler.compile(sys.argv[1])
art.export(sys.argv[2])
compiler.load(sys.argv[2]).run({"ids": __import__("numpy").arange(8).reshape(1, 8)})
print(json.dumps(art.report()))
"""


def _tvm_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if tvm_log.TVM_LINE.match(line)]


@pytest.mark.slow
def test_relaxc_run_resnet50_prints_no_tvm_line():
    proc = relaxc("run", "onnx:resnet50", "--repeat", "1")
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
    if debug:  # TVM's own lines, as they came
        assert any("Detected pow" in line for line in _tvm_lines(proc.stderr))
        assert any("Scope Loaded" in line for line in _tvm_lines(proc.stderr))
        return
    assert _tvm_lines(proc.stderr) == [], proc.stderr
    report = json.loads(proc.stdout)
    assert len(report["warnings"]) == 1 and "not bounds-checked" in report["warnings"][0]
    assert "1 Gather node(s)" in report["warnings"][0]
    assert report["warnings"][0] in proc.stderr  # said once in relaxc's words, through its logger
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
