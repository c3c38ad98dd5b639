"""compile(constants=...) / --constant: inputs fixed at compile time become constants of the model."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import relaxc
from tests import reference
from tests.helpers import run_cli


def _reduce_with_axes_input() -> onnx.ModelProto:
    """ReduceSum whose axes are a graph input, as the ONNX node suite has them: TVM's importer
    takes only constant axes."""
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)]
    return reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5]),
                                    helper.make_tensor_value_info("axes", TensorProto.INT64, [1])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])], [], opset=18)


def test_axes_given_as_a_constant_compile_and_leave_the_inputs():
    model = _reduce_with_axes_input()
    with pytest.raises(relaxc.UnsupportedOperatorError, match="constant axes"):
        relaxc.compile(model, tuning="off", backends="off")
    art = relaxc.compile(model, tuning="off", constants={"axes": np.array([1], np.int64)})
    assert [name for name, _, _ in art.inputs] == ["x"]
    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    np.testing.assert_allclose(art.run(x)[0], x.sum(axis=1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("constants, error, match", [
    ({"nope": np.array([1], np.int64)}, relaxc.InputError, "unknown input"),
    ({"axes": np.array([1], np.int32)}, relaxc.InputError, "dtype is int64"),
    ({"axes": np.array([1, 2], np.int64)}, relaxc.ShapeError, "does not fit"),
])
def test_bad_constants_are_user_errors(constants, error, match):
    with pytest.raises(error, match=match):
        relaxc.compile(_reduce_with_axes_input(), tuning="off", constants=constants)


def test_cli_constant_flag(tmp_path):
    path = tmp_path / "reduce.onnx"
    onnx.save(_reduce_with_axes_input(), path)
    np.save(tmp_path / "axes.npy", np.array([2], np.int64))
    proc = run_cli("run", str(path), "--constant", f"axes={tmp_path / 'axes.npy'}")
    assert proc.returncode == 0, proc.stderr
    assert "output y: shape (3, 4) float32" in proc.stdout
    proc = run_cli("run", str(path), "--constant", f"axes={tmp_path / 'missing.npy'}")
    assert proc.returncode == 2 and "cannot read --constant axes=" in proc.stderr
