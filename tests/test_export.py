"""Export writes a library and a manifest; load runs it in a fresh process with only TVM's runtime."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import compiler
from tests import reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOAD_AND_RUN = """
import sys, json, numpy as np
import compiler
dep = compiler.load(sys.argv[1])
x = np.load(sys.argv[2])
out = dep.run({dep.inputs[0][0]: x})
np.save(sys.argv[3], out[0])
print(json.dumps({"onnx_imported": "onnx" in sys.modules, "inputs": dep.inputs, "fp": dep.fingerprint}))
"""


@pytest.mark.parametrize("model", ["onnx:squeezenet", "small_cnn"])
def test_export_then_load_in_fresh_process_gives_identical_outputs(tmp_path, model):
    source = reference.small_cnn() if model == "small_cnn" else model
    art = compiler.compile(source)
    manifest_path = art.export(tmp_path / "model.so")
    assert sorted(os.listdir(tmp_path)) == ["model.json", "model.so"]
    manifest = json.loads(open(manifest_path).read())
    assert manifest["inputs"][0]["shape"] == list(art.inputs[0][1])
    assert manifest["target"]["kind"] == "llvm" and manifest["fingerprint"] == art.fingerprint
    assert {"tvm", "tvm_ffi", "llvm", "relaxc"} <= set(manifest["versions"])

    x = reference.random_inputs(art.inputs)[art.inputs[0][0]]
    np.save(tmp_path / "x.npy", x)
    proc = subprocess.run([sys.executable, "-c", LOAD_AND_RUN, str(tmp_path / "model.so"),
                           str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["onnx_imported"] is False
    assert info["fp"] == art.fingerprint
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), art.run(x)[0])


def test_loaded_artifact_validates_inputs(tmp_path):
    art = compiler.compile(reference.small_cnn())
    art.export(tmp_path / "m.so")
    dep = compiler.load(tmp_path / "m.so")
    with pytest.raises(compiler.InputError, match=r"expected shape \(1, 3, 32, 32\)"):
        dep.run(np.zeros((1, 3, 31, 32), np.float32))


@pytest.mark.parametrize("start", ["compile", "load"])
@pytest.mark.parametrize("env, expected", [({}, "physical"), ({"TVM_NUM_THREADS": "1"}, "1")])
def test_runtime_threads_default_to_physical_cores(env, expected, start, tmp_path):
    """TVM alone would use half the logical CPUs: one thread on a 2-core VM without SMT. relaxc sets
    its default when a compile starts or an artifact is loaded; importing it changes nothing."""
    import psutil

    compiler.compile(reference.small_cnn(), tuning="off").export(tmp_path / "m.so")
    begin = ("compiler.compile(reference.small_cnn(), tuning='off')" if start == "compile"
             else f"compiler.load({str(tmp_path / 'm.so')!r})")
    code = ("import os, compiler, tvm; from tests import reference; "
            "untouched = not {'TVM_NUM_THREADS', 'TVM_BIND_THREADS'} & set(os.environ); "
            f"{begin}; print(untouched, tvm.get_global_func('runtime.NumThreads')())")
    clean = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "TVM_BIND_THREADS")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**clean, **env, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr
    untouched, threads = proc.stdout.split()[-2:]
    want = psutil.cpu_count(logical=False) if expected == "physical" else int(expected)
    assert int(threads) == want
    assert untouched == ("True" if not env else "False")  # import compiler set nothing
