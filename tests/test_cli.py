"""The relaxc command line: success paths print what they did; user errors exit 2 on one line."""

import json
import os

import numpy as np
import onnx
import pytest

import relaxc
from relaxc.passes import check_indices
from tests import reference
from tests.helpers import run_cli


def test_compile_run_and_inspect(model_file, tmp_path):
    out = tmp_path / "small.so"
    proc = run_cli("compile", str(model_file), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "compiled small" in proc.stdout and out.exists() and (tmp_path / "small.json").exists()
    assert "[relaxc] simplify" in proc.stderr  # progress per phase

    x = reference.random_inputs([("x", (1, 3, 32, 32), "float32")])["x"]
    np.save(tmp_path / "x.npy", x)
    proc = run_cli("run", str(out), "--input", f"x={tmp_path / 'x.npy'}", "--repeat", "3")
    assert proc.returncode == 0, proc.stderr
    expected = reference.ort_run(reference.small_cnn(), {"x": x})[0]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("output y:"))
    assert "shape (1, 10) float32" in line
    assert float(line.split(" sum ")[1].split()[0]) == pytest.approx(float(expected.sum()), rel=1e-4)
    assert "latency: median" in proc.stdout and "over 3 runs" in proc.stdout

    proc = run_cli("inspect", str(model_file), "--phase", "simplify", "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout[: proc.stdout.index("\n}\n") + 2])
    assert report["ops"]["Conv"] == 3
    assert "R.nn.conv2d" in proc.stdout and proc.stderr == ""

    proc = run_cli("inspect", str(model_file), "--phase", "layout", "--block", "8", "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    assert 'data_layout="NCHW8c"' in proc.stdout and "pad_value=T.float32(0.0)" in proc.stdout
    report = json.loads(proc.stdout[: proc.stdout.index("\n}\n") + 2])
    # the 20-channel tensors padded to 24; the RGB input x a 3-lane block of its own, unpadded
    assert {(p["from"], p["to"]) for p in report["layout"]["padded_tensors"]} == {(20, 24)}


def test_report_summary_fits_on_a_screen_and_json_has_it_all(model_file):
    proc = run_cli("run", str(model_file), "--report", "--repeat", "2")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) <= 24 and max(map(len, lines)) <= 200, proc.stdout
    text = proc.stdout
    for part in ("compiled in", "layout: NCHW", "memory: arena", "the lower bound", "kernels:", "latency: median"):
        assert part in text, part
    tune = next(line for line in lines if "to tune the" in line).split(": ", 1)[1]
    assert tune.startswith(f"relaxc tune {model_file} -t ") and '"mcpu"' in tune  # the exact target, quoted

    proc = run_cli("run", str(model_file), "--json", "--repeat", "1", "-q")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ops"]["Conv"] == 3 and report["memory"]["tensors"] and report["warnings"] == []


def test_inspect_memory_prints_the_plan(model_file):
    proc = run_cli("inspect", str(model_file), "--memory", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "planner arena:" in proc.stdout and "lower bound" in proc.stdout and "TVM StaticPlanBlockMemory" in proc.stdout


def test_memory_chart_is_a_png(tmp_path):
    from relaxc.benchmarks.charts import memory_chart

    memory = relaxc.compile(reference.small_cnn(), tuning="off").report()["memory"]
    chart = memory_chart(memory, str(tmp_path / "plan.png"), "small")
    assert open(chart, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(chart) > 10_000
    with pytest.raises(relaxc.UserError, match="directory /no/such/dir does not exist"):
        memory_chart(memory, "/no/such/dir/plan.png")


def test_run_compiles_onnx_with_shape_binding(model_file, tmp_path):
    model = onnx.load(model_file)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "n"
    onnx.save(model, tmp_path / "dyn.onnx")
    proc = run_cli("run", str(tmp_path / "dyn.onnx"), "--shape", "x=2,3,32,32", "--repeat", "1", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "output y: shape (2, 10) float32" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["run", "/no/such.onnx"], "relaxc: error: model file not found: /no/such.onnx"),
    (["compile", "onnx:resnet18"], "relaxc: error: unknown bundled model 'onnx:resnet18'"),
    (["inspect", "MODEL", "-t", "cuda9"], "relaxc: error: unknown target 'cuda9'"),
    (["run", "MODEL", "--input", "y=/tmp/none.npy"], "relaxc: error: --input names unknown input(s) ['y']"),
    (["run", "MODEL", "--shape", "x=1,3,32"], "relaxc: error: input 'x' has rank 4, but shapes gives 3 dims"),
    (["inspect", "MODEL", "--phase", "bogus"], "relaxc: error: unknown phase 'bogus'"),
])
def test_user_errors_exit_2_with_one_line(model_file, args, message):
    proc = run_cli(*[str(model_file) if a == "MODEL" else a for a in args], "-q")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith(message) and "Traceback" not in proc.stderr


def test_malformed_arguments_exit_2(model_file):
    proc = run_cli("run", str(model_file), "--shape", "x:1,3")
    assert proc.returncode == 2 and "expected NAME=D0,D1" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.timing  # which kernels lose most is timed: beside another pytest process it varies
def test_profile_lists_kernels_sorted_with_schedule_kind_and_roofline():
    proc = run_cli("profile", "zoo:gpt2", "--top", "5", "--worst", "-q")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip()[:1].isdigit() and "%" in line]
    assert len(rows) == 5
    lost = [float(row[8]) for row in rows]
    assert lost == sorted(lost, reverse=True)  # --worst: by time lost against the roofline bound
    assert {row[9] for row in rows} <= {"dense", "rows", "tiled", "basic", "tuned", check_indices.LABEL}
    assert any(row[10] == "matmul/conv" for row in rows)
    assert "more kernels" in proc.stdout and "end to end" in proc.stdout
    assert "by time lost against the roofline" in proc.stdout and "machine: " in proc.stdout
