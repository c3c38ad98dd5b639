"""The roofline: the machine's measured limits, each kernel's FLOPs and bytes, and the profile's
distance from the bound (compiler/build/roofline.py, compiler/build/profile.py)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tvm.script import tirx as T

import relaxc
from relaxc.build import profile, roofline
from relaxc.passes.tir import fast_math
from relaxc.support.targets import resolve

M, N, K = 384, 384, 384


def _matmul_model() -> onnx.ModelProto:
    weight = helper.make_tensor("w", TensorProto.FLOAT, [K, N], np.random.default_rng(0).standard_normal(K * N))
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_kernel_cost_counts_multiply_adds_and_each_argument_once():
    @T.prim_func(s_tir=True)
    def matmul(a: T.Buffer((M, K), "float32"), b: T.Buffer((K, N), "float32"), c: T.Buffer((M, N), "float32")):
        for i, j, k in T.grid(M, N, K):
            with T.sblock("c"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    c[vi, vj] = T.float32(0)
                c[vi, vj] = c[vi, vj] + a[vi, vk] * b[vk, vj]

    cost = roofline.kernel_cost(matmul)
    assert cost.flops == 2 * M * N * K
    assert cost.nbytes == 4 * (M * K + K * N + M * N)


def test_an_expanded_function_counts_as_the_arithmetic_it_expands_to():
    @T.prim_func(s_tir=True)
    def swish(a: T.Buffer((64, 32), "float32"), b: T.Buffer((64, 32), "float32")):
        for i, j in T.grid(64, 32):
            with T.sblock("b"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vi, vj] * T.exp(a[vi, vj] + T.float32(1))

    exp = fast_math.operations("tirx.exp")
    assert 20 < exp < 60  # a degree-6 polynomial, range reduction and exponent-field scaling
    assert roofline.kernel_cost(swish).flops == 64 * 32 * (2 + exp)


def test_the_bound_is_the_slower_of_compute_and_the_memory_level_the_bytes_fit():
    machine = roofline.Machine(2, peak_gflops=100.0, bandwidth=((1 << 16, 200.0), (1 << 20, 100.0), (1 << 30, 10.0)))
    assert machine.gbps_for(1 << 16) == 200.0 and machine.gbps_for((1 << 16) + 1) == 100.0
    assert machine.gbps_for(1 << 40) == 10.0  # past every measured size: memory's
    assert machine.bound_s(1e9, 1 << 10) == pytest.approx(1e-2)  # compute bound
    assert machine.bound_s(1e9, 1 << 10, 4) == pytest.approx(1e-2 / 4)  # 8-bit products, VNNI's 4 a lane
    assert machine.bound_s(0, 1 << 29) == pytest.approx((1 << 29) / 10e9)  # memory bound


@pytest.mark.timing
def test_the_machine_is_measured_once_and_kept_in_the_store(tmp_path, monkeypatch):
    target = resolve("cpu")
    measured = roofline.machine(target, str(tmp_path))
    assert measured.peak_gflops > 1
    sizes = [size for size, _ in measured.bandwidth]
    assert sizes == sorted(sizes) and len(sizes) == 4
    # a cache is faster than memory on any CPU: the fastest cache level, as a core shared with another process
    # (CI's) slows the shortest runs, the smallest working set's, most
    assert max(gbps for _, gbps in measured.bandwidth[:-1]) > measured.bandwidth[-1][1]

    def measure_again(*_args):
        raise AssertionError("measured again although the store has the numbers")

    monkeypatch.setattr(roofline, "measure", measure_again)
    assert roofline.machine(target, str(tmp_path)) == measured


@pytest.mark.timing
def test_a_matmul_reaches_a_fair_share_of_the_peak_and_never_much_more():
    """The peak is not underestimated (no kernel runs well above it) and a dense matmul is no cliff."""
    art = relaxc.compile(_matmul_model(), tuning="off")
    machine = roofline.machine(art.target)
    # the best of three profiles: one lasts ~30 ms, short enough for a shared VM's hiccup to cover it
    results = [profile.profile(art, {"x": np.ones((M, K), "float32")}, machine) for _ in range(3)]
    result = min(results, key=lambda r: max(r.kernels, key=lambda k: k.flops).ms)
    matmul = max(result.kernels, key=lambda k: k.flops)
    assert matmul.flops == 2 * M * N * K and matmul.kind == "matmul/conv"
    assert 0.10 < matmul.roofline < 1.3, (matmul, machine.summary())
    assert not result.cliffs()
    as_json = result.as_dict()
    assert as_json["machine"]["peak_gflops"] == machine.peak_gflops
    assert abs(sum(k["share"] for k in as_json["kernels"]) - 1) < 1e-6
    assert all(k["roofline"] > 0 and k["lost_ms"] == k["ms"] - k["bound_ms"] for k in as_json["kernels"])


def _kernel(name: str, ms: float, bound_ms: float, share: float) -> profile.KernelTime:
    return profile.KernelTime(name, "basic", "reduction", 1, ms, share, 0.0, 0, bound_ms)


def test_worst_sorts_by_time_lost_against_the_bound_and_marks_cliffs():
    kernels = [_kernel("fast_but_long", 6.0, 5.5, 0.6), _kernel("cliff", 3.0, 0.1, 0.3), _kernel("small", 1.0, 0.05, 0.1)]
    result = profile.Profile(kernels, 10.0, 11.0, roofline.Machine(2, 100.0, ((1 << 30, 10.0),)))
    assert [k.name for k in result.cliffs()] == ["cliff", "small"]
    rows = [line.split() for line in result.table(worst=True).splitlines() if line.strip()[:1].isdigit()]
    assert [row[11] for row in rows] == ["cliff", "small", "fast_but_long"]
    assert "<-" in rows[0] and "<-" not in rows[2]
    assert "2 cliffs" in result.table()
