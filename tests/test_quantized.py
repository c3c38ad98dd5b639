"""Quantized (QDQ) models: convolutions and additions on the integers, equal to onnxruntime's int8."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper, shape_inference

import relaxc as compiler
from relaxc.support import targets
from tests import reference

pytest.importorskip("onnxruntime.quantization", reason="onnxruntime's quantization tool makes the QDQ models")

from relaxc.benchmarks.quantized import agreement, output_step, quantize  # noqa: E402


def _float_cnn(seed: int = 3) -> onnx.ModelProto:
    """Conv 3->16 + ReLU, max pooling, conv 16->32 + ReLU, depthwise 3x3 + ReLU, pointwise conv, residual
    add + ReLU, SiLU, grouped conv, GlobalAveragePool, Gemm: the forms quantize_static emits for CNNs."""
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.standard_normal(s) * np.sqrt(2.0 / np.prod(s[1:]))  # noqa: E731
    inits = [reference._const(name, value) for name, value in (
        ("w1", w(16, 3, 3, 3)), ("b1", rng.standard_normal(16) * 0.1), ("w2", w(32, 16, 3, 3)),
        ("b2", rng.standard_normal(32) * 0.1), ("dw", w(32, 1, 3, 3)), ("db", rng.standard_normal(32) * 0.1),
        ("w3", w(32, 32, 1, 1)), ("b3", rng.standard_normal(32) * 0.1), ("gw", w(32, 8, 1, 1)), ("fc", w(10, 32)),
        ("fcb", rng.standard_normal(10) * 0.1))]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "dw", "db"], ["d"], pads=[1, 1, 1, 1], group=32),
        helper.make_node("Relu", ["d"], ["rd"]),
        helper.make_node("Conv", ["rd", "w3", "b3"], ["c3"]),
        helper.make_node("Add", ["c3", "r2"], ["res"]),
        helper.make_node("Relu", ["res"], ["r3"]),
        helper.make_node("Sigmoid", ["r3"], ["sig"]),
        helper.make_node("Mul", ["r3", "sig"], ["silu"]),
        helper.make_node("Conv", ["silu", "gw"], ["g"], group=4),
        helper.make_node("GlobalAveragePool", ["g"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc", "fcb"], ["y"], transB=1),
    ]
    return reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)


@pytest.fixture(scope="module")
def quantized() -> onnx.ModelProto:
    return quantize(_float_cnn())


def _with_quantized_outputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` also returning every uint8 tensor a ``QuantizeLinear`` makes, and what each follows."""
    inferred = shape_inference.infer_shapes(model)
    infos = {v.name: v for v in inferred.graph.value_info}
    producers = {out: node for node in inferred.graph.node for out in node.output}
    follows = []
    for node in inferred.graph.node:
        if node.op_type == "QuantizeLinear" and node.output[0] in infos:
            inferred.graph.output.append(infos[node.output[0]])
            source = producers.get(node.input[0])
            follows.append(source.op_type if source is not None else "input")
    return inferred, follows


def test_integer_forms_equal_onnxruntime_int8_to_the_bit(quantized):
    model, follows = _with_quantized_outputs(quantized)
    art = compiler.compile(model, tuning="off", backends="relaxc")
    summary = art.report()["quantized"]
    assert [summary[k] for k in ("convolutions", "requantized", "adds", "moves", "tables")] == [4, 4, 1, 2, 2]
    session = reference.ort_session(model)
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)
        got, want = art.run(x), session.run(None, {"x": x})
        for follow, a, b in zip(follows, got[1:], want[1:]):
            assert a.dtype == np.uint8 and a.shape == b.shape
            difference = np.abs(a.astype(int) - b.astype(int))
            if follow in ("Conv", "Add", "MaxPool", "Flatten", "Sigmoid", "Mul", "input"):
                assert difference.max() == 0, f"after {follow}: {np.mean(difference > 0):.4f} of the elements differ"
            else:  # average pooling, the grouped conv and the Gemm stay in float: within a step
                assert difference.max() <= 1, f"after {follow}: {difference.max()} steps"
        equal, worst = agreement(got[:1], want[:1], output_step(model))
        assert equal >= 0.999 and worst <= 1


def test_the_report_says_which_convolutions_stay_in_float_and_why(quantized):
    summary = compiler.compile(quantized, tuning="off", backends="relaxc").report()["quantized"]
    assert summary["float"] == {"a grouped convolution": 1}


@pytest.mark.parametrize("out_channels, group", [(8, 1), (4, 4)], ids=["dense", "depthwise"])
def test_data_with_a_zero_point_is_padded_with_it(out_channels, group):
    """A uint8 input with zero point 128 through a padded conv: the border reads 128, not 0."""
    rng = np.random.default_rng(0)
    scales = (rng.random(out_channels) * 0.01 + 0.001).astype(np.float32)
    weights = rng.integers(-127, 128, (out_channels, 4 // group, 3, 3), dtype=np.int8)
    constants = {"xs": np.float32(0.05), "xz": np.uint8(128), "wq": weights, "ws": scales,
                 "wz": np.zeros(out_channels, np.int8), "ys": np.float32(0.1), "yz": np.uint8(3)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1], group=group),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["y"])]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                             [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, out_channels, 6, 6])],
                             [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()])
    art = compiler.compile(model, tuning="off", backends="relaxc")
    assert art.report()["quantized"]["requantized"] == 1
    x = np.random.default_rng(1).standard_normal((1, 4, 6, 6)).astype(np.float32)
    np.testing.assert_array_equal(art.run(x)[0], reference.ort_session(model).run(None, {"x": x})[0])


def test_vnni_targets_schedule_the_integer_convolutions_with_vpdpbusd(quantized):
    """Compiled for a VNNI CPU (not run: the host may lack it), every integer convolution is VNNI's."""
    target = {"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2}
    art = compiler.compile(quantized, target=target, tuning="off", backends="relaxc")
    assert art.report()["schedules"].get("vnni") == 3  # the depthwise conv sums in float: not VNNI's
    assert "llvm.x86.avx512.vpdpbusd.512" in art.ir("schedule")
    if not targets.runs_on_host(targets.resolve(target)):
        pytest.skip("this CPU has no AVX-512 VNNI: the VNNI build is not run")
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(art.run(x)[0], compiler.compile(quantized, tuning="off", backends="relaxc").run(x)[0])
