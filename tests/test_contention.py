"""benchmarks/contention.py end to end on a small model: relaxc's launcher, TVM's pool and onnxruntime
timed with the second core free and busy (the numbers are not asserted: docs/concurrency.md has them)."""

import subprocess
import sys

import onnx

import relaxc
from tests import reference


def test_the_contention_benchmark_times_both_launchers_and_onnxruntime(tmp_path):
    model = tmp_path / "small.onnx"
    onnx.save(reference.small_cnn(), model)
    relaxc.compile(str(model)).export(tmp_path / "small.so")
    proc = subprocess.run([sys.executable, "-m", "relaxc.benchmarks.contention", str(tmp_path / "small.so"), str(model),
                           "--rounds", "1", "--repeat", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split(" | ")[0].strip("| "): line for line in proc.stdout.splitlines() if line.startswith("| relaxc")
            or line.startswith("| onnxruntime")}
    assert set(rows) == {"relaxc", "relaxc, TVM's pool", "onnxruntime"}, proc.stdout
    assert "Unloaded, relaxc's launcher against TVM's pool" in proc.stdout
