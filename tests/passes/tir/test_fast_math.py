"""passes/tir/fast_math.py: the vectorised transcendental functions, measured against numpy in float64
over the whole float32 range (tools/experiments/fast_math.py says how), and shown to replace TVM's scalar
calls. The bounds are the ones docs/fast_math.md reports."""

import numpy as np
import pytest
import tvm
from tvm import te

from relaxc.passes.tir import fast_math
from tools.experiments import fast_math as measure

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})  # AVX2: runs on every CPU this project meets
LANES = 8

# name: (max ulp on normal results, whether subnormal results may be flushed to 0)
# sigmoid(x < -87.3) is 0 rather than a subnormal, as TVM's own sigmoid gives.
BOUNDS = {"exp": (1, False), "log": (1, False), "tanh": (4, False), "erf": (5, False), "sigmoid": (2, True)}


def _run(fn, x: np.ndarray) -> np.ndarray:
    fast_math.register()
    return measure.run(measure.kernel(fn, len(x), TARGET, LANES), x)


@pytest.mark.parametrize("name", BOUNDS)
def test_accuracy_over_the_float32_range(name):
    max_ulp, flushes = BOUNDS[name]
    x = measure.inputs()
    e = measure.errors(name, _run(measure.FUNCTIONS[name][0], x), x)
    assert e["nan_exact"], "NaN in, NaN out, and nowhere else"
    assert e["inf_exact"], "overflow gives the right infinity"
    assert e["signs_exact"]
    assert e["max_ulp"] <= max_ulp
    # subnormal results: the same relative error plus their coarser rounding, or 0 where flushed
    bound = measure.TINY if flushes else max_ulp * 2.0**-23 * np.abs(e["subnormal_exact"]) + 1.5e-45
    assert (e["subnormal_errors"] <= bound).all()


def _pad(values: list[float]) -> np.ndarray:
    return np.array(values + [0.0] * (LANES * 4 - len(values)), np.float32)


def test_limits_are_exact():
    assert _run(te.exp, _pad([-np.inf, np.inf, 0.0, -200.0, 200.0]))[:5].tolist() == [0.0, np.inf, 1.0, 0.0, np.inf]
    log = _run(te.log, _pad([0.0, -0.0, np.inf, -np.inf, -1.0, 1.0, 1e-45, 2.0]))[:8]
    np.testing.assert_array_equal(log[:6], [-np.inf, -np.inf, np.inf, np.nan, np.nan, 0.0])
    np.testing.assert_allclose(log[6:], np.log(np.float32([1e-45, 2.0])), rtol=1e-7)  # a subnormal's log
    assert _run(te.tanh, _pad([-np.inf, np.inf, 0.0, 20.0, -20.0]))[:5].tolist() == [-1.0, 1.0, 0.0, 1.0, -1.0]
    assert _run(te.erf, _pad([-np.inf, np.inf, 0.0, 10.0]))[:4].tolist() == [-1.0, 1.0, 0.0, 1.0]
    assert _run(te.sigmoid, _pad([-np.inf, np.inf, 0.0]))[:3].tolist() == [0.0, 1.0, 0.5]


@pytest.mark.parametrize("exponent", [2.0, 3.0, 4.0, -1.0, -2.0])
def test_pow_with_a_small_integer_exponent_is_multiplication(exponent):
    def power(v):
        return te.power(v, tvm.tirx.const(exponent, "float32"))

    x = np.random.default_rng(2).standard_normal(4096).astype(np.float32) * 10
    np.testing.assert_allclose(_run(power, x), x.astype(np.float64) ** exponent, rtol=1e-6)
    assert "powf" not in measure.kernel(power, len(x), TARGET, LANES).mod.inspect_source("asm")


def test_no_scalar_calls_left_in_the_machine_code():
    """TVM's own lowering calls expf/logf/erff once per element; ours is arithmetic."""
    fast_math.register()
    for fn in (te.exp, te.log, te.tanh, te.erf, te.sigmoid):
        asm = measure.kernel(fn, 4096, TARGET, LANES).mod.inspect_source("asm")
        assert not any(name in asm for name in ("expf", "logf", "erff", "tanhf")), fn.__name__


def test_sigmoid_divides_without_a_division_instruction():
    """Its quotient is Newton-Raphson FMAs: a vector division costs several times an FMA, and
    swish epilogues (EfficientNet) evaluate a sigmoid for every output."""
    fast_math.register()
    asm = measure.kernel(te.sigmoid, 4096, TARGET, LANES).mod.inspect_source("asm")
    assert "vfmadd" in asm and "vdivps" not in asm


@pytest.mark.parametrize("exponent", [0.75, 0.5, 0.25, 1.5, -0.75, -0.5])
def test_pow_with_a_quarter_exponent_is_multiplication_of_roots(exponent):
    """LRN's x^0.75 (AlexNet, GoogLeNet): square roots, no scalar powf; the signed limits as pow's."""
    def power(v):
        return te.power(v, tvm.tirx.const(exponent, "float32"))

    x = np.abs(np.random.default_rng(3).standard_normal(4096).astype(np.float32)) * 10 + 1e-3
    np.testing.assert_allclose(_run(power, x), x.astype(np.float64) ** exponent, rtol=1e-6)
    special = _pad([0.0, -0.0, np.inf, -np.inf, -1.0, np.nan])
    zero, inf = (np.inf, 0.0) if exponent < 0 else (0.0, np.inf)  # C's pow (onnxruntime's), not numpy's sqrt
    want = np.array([zero, zero, inf, inf, np.nan, np.nan], np.float32)
    got = _run(power, special)[:6]
    np.testing.assert_array_equal(got, want)
    assert (np.signbit(got[:4]) == np.signbit(want[:4])).all()
    assert "powf" not in measure.kernel(power, len(x), TARGET, LANES).mod.inspect_source("asm")


@pytest.mark.parametrize("op", ["Softplus", "Mish"])
def test_softplus_and_mish_match_onnxruntime_in_vector_form(op):
    """Both are log(1 + exp(x)) in TVM's importer: a vectorised elementwise kernel, not one logf call
    per element, and onnxruntime's results over the range where exp overflows."""
    from onnx import TensorProto, helper

    import relaxc
    from tests import reference

    shape = [1, 16, 28, 28]
    model = reference._model([helper.make_node(op, ["x"], ["out"])],
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                             [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)], [], 18)
    art = relaxc.compile(model, tuning="off")
    kernels = [f for f in art.module("final").functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    logs = [f.script() for f in kernels if "T.log" in f.script()]
    assert logs and all("T.vectorized" in script for script in logs)
    x = {"x": (np.random.default_rng(4).standard_normal(shape) * 40).astype(np.float32)}
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))
