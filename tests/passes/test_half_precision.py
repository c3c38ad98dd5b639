"""passes/half_precision.py: half-precision reductions accumulate in float32, softmax step by step."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import relaxc
from tests import reference


def _compile(nodes, inputs, output, elem_type):
    model = reference._model(nodes, [helper.make_tensor_value_info(n, elem_type, s) for n, s in inputs],
                             [helper.make_tensor_value_info("y", elem_type, output)], [], opset=18)
    return relaxc.compile(model, target="cpu", tuning="off")


def test_half_matmul_rounds_once():
    """A 512-term float16 dot product accumulated in float16 drifts many ulps; numpy (and ONNX's
    reference) accumulates in float32 and rounds once."""
    art = _compile([helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", [4, 512]), ("b", [512, 8])], [4, 8],
                   TensorProto.FLOAT16)
    assert "float32" in art.ir("simplify")
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(0, 1, s).astype(np.float16) for s in ((4, 512), (512, 8)))
    exact = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(art.run(a, b)[0], exact)


@pytest.mark.parametrize("elem_type, dtype", [(TensorProto.FLOAT16, np.float16), (TensorProto.FLOAT, np.float32)])
def test_softmax_follows_the_definition_in_half_types(elem_type, dtype):
    """Half types: exp(x - max) rounded, its sum in float32 rounded, the quotient rounded, as ONNX's
    reference computes it (the node suite's fp16 attention cases differed by an ulp when the whole
    softmax ran in float32). Float32 softmax is left to TVM's operator."""
    art = _compile([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", [6, 40])], [6, 40], elem_type)
    assert ("R.nn.softmax" in art.ir("simplify")) == (dtype == np.float32)
    x = np.random.default_rng(1).standard_normal((6, 40)).astype(dtype) * 3
    shifted = x - x.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    want = e / e.astype(np.float32).sum(axis=-1, keepdims=True).astype(dtype)
    got = art.run(x)[0]
    if dtype == np.float16:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
