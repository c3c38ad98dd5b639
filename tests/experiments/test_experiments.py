"""tools/experiments: cache_state.py, ab.py, deployed.py, compile_times.py, build_costs.py and pointwise_gemm.py:
kernels timed in each cache state; two exported builds timed against each other, in relaxc's process and with TVM's
runtime alone; a compile that fails stops the compile-time comparison; two compiles compared phase by phase and
kernel by kernel; the pointwise layer as a conv and as a GEMM computes the same thing."""

import subprocess
import sys

import numpy as np
import onnx
import pytest

import relaxc
from relaxc.runtime.runner import random_inputs
from tests import reference
from tests.helpers import env
from tools.experiments import ab, build_costs, cache_state, compile_times, pointwise_gemm


def test_cache_states_time_the_matching_calls_four_ways():
    states, count = cache_state.cache_states(reference.small_cnn(), "fused_conv2d*", rounds=2,
                                             tuning="off", dispatch="off")  # all three convolutions direct
    assert count == 3 and len(states) == 4 and all(ms > 0 for ms in states.values())


def test_ab_times_two_builds_whole_and_kernel_by_kernel(tmp_path):
    model = reference.small_cnn()
    art = relaxc.compile(model, tuning="off")
    builds = {}
    for name in ("first", "second"):
        art.export(tmp_path / f"{name}.so")
        builds[name] = relaxc.load(tmp_path / f"{name}.so")
    inputs = random_inputs(art.inputs)
    session = ab.checked_session(model, builds, inputs)  # asserts both match onnxruntime
    ms = ab.whole_model(builds, session, inputs, repeat=4)
    assert set(ms) == {"first", "second", "onnxruntime"} and all(v > 0 for v in ms.values())
    kernels = ab.by_kernel(builds, inputs, rounds=1)
    assert set(kernels["first"]) == set(kernels["second"])
    assert sum(1 for name in kernels["first"] if name.startswith("fused_conv2d") or "winograd" in name) >= 3


def test_deployed_builds_run_on_tvms_runtime_alone_against_onnxruntime(tmp_path):
    model = reference.small_cnn()
    onnx.save(model, tmp_path / "model.onnx")
    relaxc.compile(model, tuning="off").export(tmp_path / "build.so")
    command = [sys.executable, "-m", "tools.experiments.deployed", tmp_path / "model.onnx", tmp_path / "build.so",
               "--sets", "2", "--repeat", "2"]
    runtime_only = {**env(), "TVM_USE_RUNTIME_LIB": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=runtime_only)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.endswith("x |")]
    assert len(rows) == 2 and all(float(cell) > 0 for cell in rows[0].strip("| ").split(" | ")[:2])

    changed = onnx.ModelProto()  # a model the build was not compiled from: refused before timing
    changed.CopyFrom(model)
    weight = next(init for init in changed.graph.initializer if len(init.dims) == 4)
    weight.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weight) + np.float32(1), weight.name))
    onnx.save(changed, tmp_path / "model.onnx")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=runtime_only)
    assert done.returncode != 0 and "differs from onnxruntime" in done.stderr


def test_a_failing_compile_stops_the_compile_time_comparison_with_its_error():
    failed = r"compiling onnx:no_such_model from \. with \{'tuning': 'off'\} failed: .*unknown bundled model"
    with pytest.raises(SystemExit, match=failed):
        compile_times.seconds(".", "no_such_model", 1, {"tuning": "off"})


def test_a_pointwise_layer_as_a_conv_and_as_a_gemm_computes_the_same_and_both_are_timed():
    cin, cout, size = 32, 48, 5
    conv, gemm = (pointwise_gemm.one_layer(cin, cout, size, as_gemm) for as_gemm in (False, True))
    x = np.random.default_rng(0).standard_normal((1, cin, size, size)).astype(np.float32)
    rows = x.reshape(cin, size * size).T.copy()
    by_conv = reference.ort_session(conv).run(None, {"x": x})[0]
    by_gemm = reference.ort_session(gemm).run(None, {"x": rows})[0]
    np.testing.assert_allclose(by_gemm.T.reshape(1, cout, size, size), by_conv, rtol=1e-5, atol=1e-5)
    assert by_conv.max() > 0 and by_conv.min() == 0  # the ReLU cuts something
    for model, kernel in ((conv, "conv"), (gemm, "dense")):
        name, ms = pointwise_gemm.main_kernel_ms(model, "off")
        assert kernel in name and ms > 0


def test_build_costs_compare_two_compiles_phase_by_phase_and_kernel_by_kernel():
    sides = [{"tuning": "off", "dispatch": "off"}, {"tuning": "off", "dispatch": "rule"}]
    costs = build_costs.measure(reference.small_cnn(), sides, rounds=1, top=3)
    assert next(iter(costs.phases)) == "whole compile" and {"dispatch", "build"} <= set(costs.phases)
    assert all(before > 0 and after > 0 for before, after in (costs.phases["whole compile"], costs.grouped))
    assert costs.kernels[1] == costs.kernels[0] + 2  # the 20->20 3x3 convolution as three Winograd kernels
    assert len(costs.slowest) == 3 and costs.typical > 0
    assert all(build > 0 and code > 0 for _, build, code in costs.slowest)
    assert [sum(k[1:]) for k in costs.slowest] == sorted((sum(k[1:]) for k in costs.slowest), reverse=True)
