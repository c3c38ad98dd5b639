"""The Rows rule: softmax, LayerNorm and RMSNorm (reductions over the last axis), row by row, for
rows that divide into vectors and rows that do not; matmuls are not its."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import relaxc
from tests import reference
from tests.helpers import host_runs_avx2


def _model(nodes, width: int, inits=(), opset: int = 18):
    shape = [2, 5, width]
    return reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                            [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)], list(inits), opset)


def _params(width: int):
    rng = np.random.default_rng(0)
    return [numpy_helper.from_array(rng.uniform(0.5, 1.5, width).astype(np.float32), "g"),
            numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), "b")]


def _forms(width: int):
    rms = [helper.make_node("Mul", ["x", "x"], ["sq"]),
           helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
           helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["rms"]),
           helper.make_node("Div", ["x", "rms"], ["n"]), helper.make_node("Mul", ["n", "g"], ["out"])]
    return {
        "softmax": ([helper.make_node("Softmax", ["x"], ["out"], axis=-1)], []),
        "layernorm": ([helper.make_node("LayerNormalization", ["x", "g", "b"], ["out"], axis=-1)], _params(width)),
        "rmsnorm": (rms, _params(width)[:1] + [numpy_helper.from_array(np.array([-1], np.int64), "axes"),
                                             numpy_helper.from_array(np.array(1e-6, np.float32), "eps")]),
    }


@pytest.mark.parametrize("width", [256, 197, 16, 7])
@pytest.mark.parametrize("form", ["softmax", "layernorm", "rmsnorm"])
def test_row_reductions_are_row_scheduled_and_correct(form, width):
    nodes, inits = _forms(width)[form]
    model = _model(nodes, width, inits)
    art = relaxc.compile(model, target="cpu", tuning="off")
    assert art.report()["schedules"].get("rows", 0) >= 1, art.report()["schedules"]
    x = reference.random_inputs(art.inputs, seed=1)
    x["x"] = x["x"] * 3 + 1  # a mean and a spread to normalise away
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


@pytest.mark.parametrize("block", [16, 0], ids=["blocked", "nchw"])
def test_a_pool_window_is_not_a_row(block):
    """Reductions over several axes are rows only when the innermost one alone runs along memory
    (a blocked LayerNorm's lanes): a max pool's window does not, blocked or in NCHW, where its
    innermost tap moves with the output column (ResNet-18's took 0.52 ms as rows, 0.04 ms tiled)."""
    rng = np.random.default_rng(0)
    model = reference._model(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("MaxPool", ["c"], ["out"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 16, 16])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 32, 8, 8])],
        [numpy_helper.from_array(rng.standard_normal((32, 16, 3, 3)).astype(np.float32), "w")], 17)
    art = relaxc.compile(model, target="cpu", tuning="off", layout_block=block)
    assert art.report()["schedules"].get("rows", 0) == 0, art.report()["schedules"]
    x = reference.random_inputs(art.inputs, seed=1)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


AVX2 = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}  # 8 lanes where the host has 16


@pytest.mark.parametrize("target", ["cpu", AVX2], ids=["host", "avx2"])
@pytest.mark.parametrize("width", [197, 49, 33])
def test_softmax_rows_that_do_not_divide_reduce_in_vector_partial_results(width, target):
    """A row that is not a whole number of vectors (ViT's 197 tokens, Swin's 49) is reduced over its
    padded length, the padding reading as the identity: max and sum run as vector-wide partial
    results (rfactor blocks in the scheduled kernel), and the result still matches onnxruntime with
    -inf entries and rows of large values."""
    if target is AVX2 and not host_runs_avx2():
        pytest.skip("this CPU does not run AVX2 code")
    model = _model(_forms(width)["softmax"][0], width)
    art = relaxc.compile(model, target=target, tuning="off")
    scheduled = art.ir("schedule")
    assert "T_softmax_maxelem_rf" in scheduled and "T_softmax_expsum_rf" in scheduled
    x = reference.random_inputs(art.inputs, seed=1)
    x["x"][..., ::7] = -np.inf
    x["x"][1] *= 50
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


def _middle_axis(op: str, shape: list[int], axis: int):
    out = list(shape)
    if op.startswith(("Reduce", "ArgMax")):
        out[axis] = 1
    if op.startswith("Reduce"):
        nodes = [helper.make_node(op, ["x", "axes"], ["out"], keepdims=1)]
        inits = [numpy_helper.from_array(np.array([axis], np.int64), "axes")]
    else:
        nodes, inits = [helper.make_node(op, ["x"], ["out"], axis=axis)], []
    kind = TensorProto.INT64 if op == "ArgMax" else TensorProto.FLOAT
    return reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                            [helper.make_tensor_value_info("out", kind, out)], inits, 18)


@pytest.mark.parametrize("target", ["cpu", AVX2], ids=["host", "avx2"])
@pytest.mark.parametrize("op, shape, axis", [
    ("Softmax", [1, 8, 196, 196], 2),  # attention laid out (heads, keys, queries)
    ("Softmax", [2, 24, 14, 14], 1),  # over the channels of NCHW
    ("LogSoftmax", [1, 5, 7, 33], 2),
    ("ReduceMax", [1, 64, 9, 40], 1),
    ("ReduceSum", [3, 6, 17], 1),
    ("ReduceMean", [2, 16, 5, 8], 2),
])
def test_reductions_over_a_middle_axis_run_in_columns(op, shape, axis, target):
    """A reduction over an axis that is not innermost runs as columns: slabs in parallel, the
    reduced axis outside the innermost, which runs in vectors (as rows along the strided axis, a
    softmax over the keys of an (8, 196, 196) attention map took 50 ms, onnxruntime 0.23 ms)."""
    if target == AVX2 and not host_runs_avx2():
        pytest.skip("this CPU does not run AVX2 code")
    model = _middle_axis(op, shape, axis)
    art = relaxc.compile(model, target=target, tuning="off")
    assert art.report()["schedules"].get("rows", 0) >= 1, art.report()["schedules"]
    x = reference.random_inputs(art.inputs, seed=2)
    x["x"] = x["x"] * 4
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


@pytest.mark.parametrize("shape", [[1, 64, 56, 56], [1, 3, 5, 7]])
def test_a_reduction_to_one_value_runs_in_vector_partial_results(shape):
    """GroupNorm of one group (PoolFormer's): the mean and the variance of the whole tensor reduce in
    vector partial results, not one chain of scalar adds (2 % of the roofline); a tensor that does
    not divide into vectors still reduces, as one chain."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[1, 2, 3], keepdims=1),
             helper.make_node("Sub", ["x", "m"], ["d"]), helper.make_node("Mul", ["d", "d"], ["d2"]),
             helper.make_node("ReduceMean", ["d2"], ["v"], axes=[1, 2, 3], keepdims=1),
             helper.make_node("Div", ["d", "v"], ["out"])]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                             [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)], [], 17)
    art = relaxc.compile(model, tuning="off")
    assert art.report()["schedules"].get("rows", 0) == 2, art.report()["schedules"]
    if np.prod(shape) % 8 == 0:
        assert "T.vectorized" in art.module("final")["fused_mean_subtract"].script()
    x = reference.random_inputs(art.inputs, seed=4)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


@pytest.mark.parametrize("groups", [64, 8])
def test_an_instance_norm_and_a_group_norm_through_it_reduce_by_rows(groups):
    """InstanceNormalization (as torch exports GroupNorm: reshaped to groups): its variance, one value
    per row, runs with the rows in parallel and each row in vector partial results (``Tiled`` took it
    and vectorised across rows 25,088 floats apart, on one thread: 9 % of its roofline)."""
    shape = [1, 64, 56, 56]
    rng = np.random.default_rng(5)
    ints = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
    floats = lambda name, values: numpy_helper.from_array(np.asarray(values, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("Reshape", ["x", "grouped"], ["r"]),
             helper.make_node("InstanceNormalization", ["r", "s", "b"], ["n"]),
             helper.make_node("Reshape", ["n", "back"], ["out"])]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                             [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)],
                             [ints("grouped", [1, groups, -1]), ints("back", shape),
                              floats("s", rng.uniform(0.5, 1.5, groups)), floats("b", rng.standard_normal(groups))], 17)
    art = relaxc.compile(model, tuning="off")
    variance = [f for gv, f in art.module("final").functions.items() if "variance" in gv.name_hint]
    assert len(variance) == 1 and variance[0].attrs["relaxc.schedule"] == "rows"
    assert f"T.parallel(T.int64({groups}))" in variance[0].script() and "T.vectorized" in variance[0].script()
    x = reference.random_inputs(art.inputs, seed=6)
    x["x"] = x["x"] * 3 + 1
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


@pytest.mark.parametrize("shape", [[1, 64, 56, 56], [2, 32, 100]])
def test_a_group_normalization_reduces_by_rows(shape):
    """ONNX's GroupNormalization (opset 21): reshaped to (N, groups, rest) and reduced by rows, as
    torch's export through InstanceNormalization is (TOPI's group norm: 7 % of its roofline)."""
    rng = np.random.default_rng(7)
    channels = shape[1]
    floats = lambda name, values: numpy_helper.from_array(np.asarray(values, np.float32), name)  # noqa: E731
    model = reference._model([helper.make_node("GroupNormalization", ["x", "s", "b"], ["out"], num_groups=8)],
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                             [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)],
                             [floats("s", rng.uniform(0.5, 1.5, channels)), floats("b", rng.standard_normal(channels))], 21)
    art = relaxc.compile(model, tuning="off")
    assert "group_norm" not in " ".join(gv.name_hint for gv in art.module("final").functions)
    assert art.report()["schedules"].get("rows", 0) == 2, art.report()["schedules"]
    x = reference.random_inputs(art.inputs, seed=8)
    x["x"] = x["x"] * 3 + 1
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


def test_a_row_sum_alone_is_row_scheduled():
    """A reduction with nothing after it: its partial sums' write-back block is the kernel's last,
    whose loops over the rows are its spatial ones (it fell to ``Tiled``, one element at a time)."""
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["out"], keepdims=1)]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 256])],
                             [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 5, 1])],
                             [numpy_helper.from_array(np.array([-1], np.int64), "axes")])
    art = relaxc.compile(model, tuning="off")
    assert art.report()["schedules"] == {"rows": 1}
    x = np.random.default_rng(0).standard_normal((2, 5, 256)).astype(np.float32)
    np.testing.assert_allclose(art.run(x)[0], reference.ort_session(model).run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
