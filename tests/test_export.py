"""Export writes a library and a manifest; load runs it in a fresh process with only TVM's runtime."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import relaxc
from relaxc.support import threads
from relaxc.support.threads import SPIN_S
from tests import reference
from tests.helpers import FakeClock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOAD_AND_RUN = """
import sys, json, numpy as np
import relaxc
dep = relaxc.load(sys.argv[1])
x = np.load(sys.argv[2])
out = dep.run({dep.inputs[0][0]: x})
np.save(sys.argv[3], out[0])
heavy = ("onnx", "tqdm", "relaxc.passes", "relaxc.schedules", "relaxc.frontend", "relaxc.build.pipeline",
         "tvm.s_tir.meta_schedule", "tvm.relax.frontend")
print(json.dumps({"imported": sorted({h for h in heavy for m in sys.modules if m == h or m.startswith(h + ".")}),
                  "inputs": dep.inputs, "fp": dep.fingerprint}))
"""


@pytest.mark.parametrize("model, runtime_lib", [("onnx:squeezenet", False), ("small_cnn", False), ("small_cnn", True)],
                         ids=["squeezenet", "small_cnn", "small_cnn-runtime-lib"])
def test_export_then_load_in_fresh_process_gives_identical_outputs(tmp_path, model, runtime_lib):
    """Loading imports none of the compiler (ONNX, the passes, schedules, MetaSchedule, tqdm), also
    with ``TVM_USE_RUNTIME_LIB=1``: TVM's runtime-only library, what a deployment image carries."""
    source = reference.small_cnn() if model == "small_cnn" else model
    art = relaxc.compile(source)
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
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TVM_USE_RUNTIME_LIB": "1" if runtime_lib else ""})
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    # plain `import tvm` loads MetaSchedule's and Relax's Python modules itself; its runtime library does not
    assert set(info["imported"]) <= (set() if runtime_lib else {"tvm.s_tir.meta_schedule", "tvm.relax.frontend"})
    assert info["fp"] == art.fingerprint
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), art.run(x)[0])


def test_loaded_artifact_validates_inputs(tmp_path):
    art = relaxc.compile(reference.small_cnn())
    art.export(tmp_path / "m.so")
    dep = relaxc.load(tmp_path / "m.so")
    with pytest.raises(relaxc.InputError, match=r"expected shape \(1, 3, 32, 32\)"):
        dep.run(np.zeros((1, 3, 31, 32), np.float32))


@pytest.mark.parametrize("start", ["compile", "load"])
@pytest.mark.parametrize("env, expected", [({}, "physical"), ({"TVM_NUM_THREADS": "1"}, "1")])
def test_runtime_threads_default_to_physical_cores(env, expected, start, tmp_path):
    """TVM alone would use half the logical CPUs: one thread on a 2-core VM without SMT. relaxc sets
    its default when a compile starts or an artifact is loaded; importing it changes nothing."""
    import psutil

    relaxc.compile(reference.small_cnn(), tuning="off").export(tmp_path / "m.so")
    begin = ("relaxc.compile(reference.small_cnn(), tuning='off')" if start == "compile"
             else f"relaxc.load({str(tmp_path / 'm.so')!r})")
    code = ("import os, relaxc, tvm; from tests import reference; "
            "untouched = not {'TVM_NUM_THREADS', 'TVM_BIND_THREADS', 'TVM_THREAD_POOL_SPIN_COUNT'} & set(os.environ); "
            "from relaxc.support.threads import spin_count; "
            f"{begin}; print(os.environ['TVM_THREAD_POOL_SPIN_COUNT'] == str(spin_count()), untouched, "
            "tvm.get_global_func('runtime.NumThreads')())")
    clean = {k: v for k, v in os.environ.items()
             if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "TVM_BIND_THREADS", "TVM_THREAD_POOL_SPIN_COUNT")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**clean, **env, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr
    spin, untouched, threads = proc.stdout.split()[-3:]
    assert spin == "True"  # the count of yields that takes SPIN_S here
    want = psutil.cpu_count(logical=False) if expected == "physical" else int(expected)
    assert int(threads) == want
    assert untouched == ("True" if not env else "False")  # importing relaxc set nothing


def test_the_spin_count_is_the_yields_that_take_spin_s_at_the_cost_a_yield_was_timed_at(monkeypatch):
    """The count of yields relaxc gives TVM's idle workers follows from what one yield was timed to
    cost here (170 ns to 500 ns on the project's VMs, far more with another process on the core):
    the derivation is checked on a clock the stand-in yields move, not on this machine's."""
    clock = FakeClock()
    assert threads.yield_s(1000, clock.perf_counter, lambda: clock.sleep(500e-9)) == pytest.approx(500e-9)
    assert threads.yield_s(1000, clock.perf_counter, lambda: None) == pytest.approx(1e-9)  # no cost measured: 1 ns, not 0
    assert threads.spin_count_for(500e-9) == round(SPIN_S / 500e-9) == 3000
    assert threads.spin_count_for(1e-9) == 300_000  # TVM's own count at most
    assert threads.spin_count_for(97e-6) == 1000  # a core shared with another process: 1,000 at least
    monkeypatch.setattr(threads, "_spin_count", None)
    monkeypatch.setattr(threads, "yield_s", lambda: 250e-9)
    assert threads.spin_count() == 6000
    monkeypatch.setattr(threads, "yield_s", lambda: pytest.fail("timed again"))
    assert threads.spin_count() == 6000  # once a process


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    art = relaxc.compile(reference.small_cnn(), tuning="off")
    folder = tmp_path_factory.mktemp("exported")
    art.export(folder / "m.so")
    return art, folder


def _copy(folder, tmp_path):
    for name in ("m.so", "m.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    return tmp_path / "m.so", tmp_path / "m.json"


def _flip_middle(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64]) + data[middle + 64:]


@pytest.mark.parametrize("damage, message", [
    (lambda lib, man: lib.write_bytes(lib.read_bytes()[: lib.stat().st_size // 2]), "does not match its manifest"),
    (lambda lib, man: lib.write_bytes(_flip_middle(lib.read_bytes())), "does not match its manifest"),
    (lambda lib, man: lib.write_bytes(b""), "does not match its manifest"),
    (lambda lib, man: man.write_text(man.read_text()[:40]), "is not valid JSON"),
    (lambda lib, man: man.write_bytes(b"\xff\xfe\x00garbage"), "is not valid JSON"),
    (lambda lib, man: man.write_text(json.dumps({**json.loads(man.read_text()), "inputs": None})),
     "inputs missing or malformed"),
    (lambda lib, man: man.write_text("[1, 2]"), "is not a relaxc manifest"),
    (lambda lib, man: man.unlink(), "is missing"),
])
def test_damaged_artifacts_are_refused_not_run(exported, tmp_path, damage, message):
    """A truncated library loaded as it is kills the process (SIGBUS): load checks the bytes first."""
    lib, man = _copy(exported[1], tmp_path)
    damage(lib, man)
    with pytest.raises(relaxc.ExportError, match=message):
        relaxc.load(lib)


def test_damaged_device_code_is_refused(exported, tmp_path):
    lib, man = _copy(exported[1], tmp_path)
    (tmp_path / "m.0.fatbin").write_bytes(b"not the fatbin export wrote")
    manifest = json.loads(man.read_text())
    manifest["device_code"] = [{"file": "m.0.fatbin", "sha256": "0" * 64, "source_sha256": "0" * 64}]
    man.write_text(json.dumps(manifest))
    with pytest.raises(relaxc.ExportError, match=r"m.0.fatbin does not match its manifest"):
        relaxc.load(lib)


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_failed_or_interrupted_export_leaves_the_old_artifact_alone(exported, tmp_path, monkeypatch, failure):
    art, folder = exported
    lib, man = _copy(folder, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def half_written(self, path, *args, **kwargs):
        with open(path, "wb") as f:  # the disk fills (or Ctrl-C comes) in the middle of the library
            f.write(b"\x7fELF" + b"\0" * 1000)
        raise failure

    monkeypatch.setattr(type(art.executable), "export_library", half_written)
    with pytest.raises(relaxc.ExportError if isinstance(failure, OSError) else KeyboardInterrupt) as err:
        art.export(lib)
    if isinstance(failure, OSError):
        assert "No space left on device" in str(err.value)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temporaries, old files intact
    np.testing.assert_array_equal(relaxc.load(lib).run(reference.random_inputs(art.inputs))[0],
                                  art.run(reference.random_inputs(art.inputs))[0])
