"""Quantized (QDQ) models: convolutions and additions on the integers, equal to onnxruntime's int8."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper, shape_inference

import relaxc
from relaxc.build.artifact import Artifact
from relaxc.support import targets
from tests import reference

pytest.importorskip("onnxruntime.quantization", reason="onnxruntime's quantization tool makes the QDQ models")

from relaxc.benchmarks.quantized import (SIGNED_KERNELS, agreement, dynamic_agreements, output_step,  # noqa: E402
                                         quantize, with_activations)


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


@pytest.mark.parametrize("activations", ["uint8", "int8"])
def test_integer_forms_equal_onnxruntime_int8_to_the_bit(quantized, activations):
    """uint8 activations, and int8 ones (the quantizer's default: held as uint8 ones 128 higher),
    against onnxruntime's int8 kernels (on x86 it runs int8 activations' convolutions in float
    unless told not to)."""
    model, follows = _with_quantized_outputs(quantized if activations == "uint8"
                                             else quantize(_float_cnn(), activations=activations))
    art = relaxc.compile(model, tuning="off", backends="off")
    summary = art.report()["quantized"]
    counts = [summary[k] for k in ("convolutions", "matmuls", "requantized", "adds", "moves", "averages", "tables")]
    assert counts == [5, 1, 6, 1, 2, 1, 2]
    session = reference.ort_session(model, config=SIGNED_KERNELS if activations == "int8" else None)
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)
        got, want = art.run(x), session.run(None, {"x": x})
        for follow, a, b in zip(follows, got[1:], want[1:]):
            assert a.dtype == np.dtype(activations) and a.shape == b.shape
            difference = np.abs(a.astype(int) - b.astype(int))
            assert difference.max() == 0, f"after {follow}: {np.mean(difference > 0):.4f} of the elements differ"
        equal, worst = agreement(got[:1], want[:1], output_step(model))
        assert equal >= 0.999 and worst <= 1


def test_the_report_says_which_convolutions_stay_in_float_and_why(quantized):
    assert relaxc.compile(quantized, tuning="off", backends="off").report()["quantized"]["float"] == {}
    rng = np.random.default_rng(0)  # 2 groups of 64 channels, 3x3: a sum of 576 products, too many for float32
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], group=2, pads=[1, 1, 1, 1])]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 6, 6])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 6, 6])],
                             [reference._const("w", rng.standard_normal((16, 64, 3, 3)) * 0.05)])
    summary = _built(quantize(model), "cascadelake").report()["quantized"]
    assert summary["float"] == {"a grouped convolution whose sums can leave float32's exact integers": 1}
    assert _built(quantize(model), "haswell").report()["quantized"]["float"] == {}  # its pairs summed in int32


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
    art = relaxc.compile(model, tuning="off", backends="off")
    assert art.report()["quantized"]["requantized"] == 1
    x = np.random.default_rng(1).standard_normal((1, 4, 6, 6)).astype(np.float32)
    np.testing.assert_array_equal(art.run(x)[0], reference.ort_session(model).run(None, {"x": x})[0])


@pytest.mark.parametrize("pool, attrs, out", [
    ("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 1, 1, 1], "count_include_pad": 0}, (4, 5)),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "count_include_pad": 1}, (7, 9)),
    ("GlobalAveragePool", {}, (1, 1))], ids=["windows", "padded", "global"])
def test_average_pooling_rounds_as_onnxruntime_int8(pool, attrs, out):
    """An odd zero point: onnxruntime's QLinearAveragePool adds it before rounding, so an average
    at an exact half rounds the other way than QuantizeLinear would; relaxc rounds as it does."""
    constants = {"s": np.float32(0.03), "z": np.uint8(121)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node(pool, ["xd"], ["p"], **attrs),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["y"])]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 7, 9])],
                             [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 16, *out])],
                             [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()])
    art = relaxc.compile(model, tuning="off", backends="off")
    assert art.report()["quantized"]["averages"] == 1
    session = reference.ort_session(model)
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, 16, 7, 9)).astype(np.float32)
        np.testing.assert_array_equal(art.run(x)[0], session.run(None, {"x": x})[0])


# an LLVM CPU name for each byte dot product (support/targets.py's BYTE_DOTS): its instruction
BYTE_DOT_CPUS = {"cascadelake": "llvm.x86.avx512.vpdpbusd.512", "alderlake": "llvm.x86.avx512.vpdpbusd.256",
                 "skylake-avx512": "llvm.x86.avx512.pmaddubs.w.512", "haswell": "llvm.x86.avx2.pmadd.ub.sw"}


def _built(model: onnx.ModelProto, mcpu: str) -> Artifact:
    return relaxc.compile(model, target={"kind": "llvm", "mcpu": mcpu, "num-cores": 2}, tuning="off",
                            backends="off")


def _built_for(model: onnx.ModelProto, mcpu: str) -> Artifact:
    """``model`` compiled for ``mcpu``, its byte dot product's instruction checked in the schedules."""
    art = _built(model, mcpu)
    assert BYTE_DOT_CPUS[mcpu] in art.ir("schedule")
    return art


def _skip_unless_the_host_runs(art: Artifact) -> None:
    if not targets.runs_on_host(art.target):
        pytest.skip(f"this CPU cannot run code for {art.target.attrs['mcpu']}: built, not run")


def _saturates_pairs(art: Artifact) -> bool:
    return targets.byte_dot(art.target).pairs is not None


def _onnxruntime_saturates_pairs() -> bool:
    """Whether this host's onnxruntime sums uint8 x int8 products in pairs saturated to int16 (no VNNI)."""
    return not {"avx512vnni", "avxvnni"} & (targets.host_isa() or frozenset())


def _skip_unless_onnxruntime_sums_as(art: Artifact) -> None:
    """Skip unless the build sums bytes as this host's onnxruntime does (both exactly or both in
    saturated pairs): where they differ, the outputs may too."""
    _skip_unless_the_host_runs(art)
    if _saturates_pairs(art) != _onnxruntime_saturates_pairs():
        pytest.skip(f"{art.target.attrs['mcpu']} sums bytes {'in saturated pairs' if _saturates_pairs(art) else 'exactly'}, "
                    "this CPU's onnxruntime the other way: built and run, not compared")


@pytest.mark.parametrize("mcpu", BYTE_DOT_CPUS)
def test_integer_convolutions_use_each_cpus_byte_dot_product(quantized, mcpu):
    """Compiled for a CPU with each byte dot product (AVX-512 VNNI, AVX-VNNI, and vpmaddubsw's saturated
    pairs for AVX-512BW and AVX2), every dense integer convolution is tensorized with it (the depthwise
    one sums in float), the 3-channel one over its taps where pairs saturate; where the host runs the
    build and its onnxruntime sums the same way, its output is onnxruntime's int8 output to the bit."""
    art = _built_for(quantized, mcpu)
    report = art.report()
    assert report["dispatch"]["choices"] == {} and report["schedules"].get("int8") == 3
    assert report["schedules"].get("taps", 0) == (1 if _saturates_pairs(art) else 0)
    _skip_unless_onnxruntime_sums_as(art)
    session = reference.ort_session(quantized)
    for seed in range(2):
        x = np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)
        np.testing.assert_array_equal(art.run(x)[0], session.run(None, {"x": x})[0])


def test_8_channel_blocks_on_a_vnni_cpu_take_the_256_bit_vpdpbusd(quantized):
    """The measured layout choice can give an AVX-512 CPU 8-channel blocks: their convolutions
    take AVX-512VL's 8-lane form of the same instruction, not the generic tiled rule."""
    art = relaxc.compile(quantized, target={"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2},
                           tuning="off", backends="off", layout_block=8)
    assert art.report()["schedules"].get("int8") == 3 and "llvm.x86.avx512.vpdpbusd.256" in art.ir("schedule")
    _skip_unless_the_host_runs(art)
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(art.run(x)[0], reference.ort_session(quantized).run(None, {"x": x})[0])


def _saturated_pairs_product(data: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """data (M, K) uint8 times weights (K, N) int8 as vpmaddubsw sums them: products of rows 2j and
    2j + 1 summed and saturated to int16, then the pairs summed exactly."""
    products = data.astype(np.int64)[:, :, None] * weights.astype(np.int64)[None]
    products = np.concatenate([products, np.zeros((len(data), len(weights) % 2, weights.shape[1]), np.int64)], 1)
    return np.clip(products.reshape(len(data), -1, 2, weights.shape[1]).sum(2), -32768, 32767).sum(1)


@pytest.mark.parametrize("rows, depth", [(5, 63), (1, 512)])
def test_without_vnni_byte_products_are_summed_in_saturated_pairs(rows, depth):
    """Built for AVX2, a MatMulInteger of large bytes sums each pair of products saturated to int16
    (what onnxruntime's kernels do there; the exact sums differ), single rows too; where this CPU's
    onnxruntime has no VNNI, its result to the bit."""
    rng = np.random.default_rng(depth)
    weights = rng.integers(-127, 128, (depth, 24)).astype(np.int8)
    model = reference._model([helper.make_node("MatMulInteger", ["a", "w"], ["y"])],
                             [helper.make_tensor_value_info("a", TensorProto.UINT8, [rows, depth])],
                             [helper.make_tensor_value_info("y", TensorProto.INT32, [rows, 24])],
                             [numpy_helper.from_array(weights, "w")])
    art = _built_for(model, "haswell")
    assert art.report()["dense"]["packed"] == 1
    _skip_unless_the_host_runs(art)
    data = rng.integers(0, 256, (rows, depth)).astype(np.uint8)
    (got,) = art.run(data)
    want = _saturated_pairs_product(data, weights)
    assert not np.array_equal(want, data.astype(np.int64) @ weights.astype(np.int64))  # the pairs did saturate
    np.testing.assert_array_equal(got, want)
    _skip_unless_onnxruntime_sums_as(art)
    np.testing.assert_array_equal(got, reference.ort_session(model).run(None, {"a": data})[0])


@pytest.mark.parametrize("channels, groups, size, stride", [(3, 1, 7, 2), (6, 2, 3, 1), (32, 4, 1, 1), (16, 4, 3, 2),
                                                            (32, 2, 5, 1)],
                         ids=["stem", "odd-group", "pointwise-groups", "strided-groups", "groups-past-float32"])
def test_without_vnni_convolutions_pair_their_taps_as_onnxruntime(channels, groups, size, stride):
    """Built for AVX2, a quantized convolution of an odd number of channels (an image's 3) sums its
    (row, column, channel) products in onnxruntime's flat pairs, across taps (``taps`` kernel),
    padding included, and a grouped one each group's so; where this CPU's onnxruntime has no VNNI,
    its int8 output to the bit."""
    rng = np.random.default_rng(size)
    out = (12 - 1) // stride + 1
    model = quantize(reference._model(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[size // 2] * 4, strides=[stride] * 2, group=groups)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, out, out])],
        [reference._const("w", rng.standard_normal((16, channels // groups, size, size)))]))
    art = _built(model, "haswell")
    assert art.report()["schedules"].get("taps", 0) == (1 if size > 1 else 0)
    assert art.report()["schedules"].get("int8", 0) == (1 if groups == 1 else 0)  # grouped: pairs in float32
    assert art.report()["quantized"]["float"] == {}
    _skip_unless_onnxruntime_sums_as(art)
    session = reference.ort_session(model)
    for seed in range(3):
        x = (np.random.default_rng(seed).standard_normal((1, channels, 12, 12)) * 2).astype(np.float32)
        np.testing.assert_array_equal(art.run(x)[0], session.run(None, {"x": x})[0])


def test_without_vnni_int8_activations_sum_exactly():
    """Built for AVX2, int8 activations (held as uint8 ones 128 higher, whose pairs of products would
    saturate where onnxruntime's int8 kernels sum exactly) sum exactly: onnxruntime's int8 output to
    the bit, on any CPU that runs the build."""
    model = quantize(_float_cnn(), activations="int8")
    art = _built_for(model, "haswell")
    assert art.report()["signed_activations"]["quantizes"] > 0 and art.report()["quantized"]["float"] == {}
    _skip_unless_the_host_runs(art)
    session = reference.ort_session(model, config=SIGNED_KERNELS)
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)
        np.testing.assert_array_equal(art.run(x)[0], session.run(None, {"x": x})[0])


def _dynamically_quantized(model: onnx.ModelProto, weight_type: str = "QInt8") -> onnx.ModelProto:
    """``model`` quantized by ``quantize_dynamic`` (``DynamicQuantizeLinear`` + ``MatMulInteger``
    or ``ConvInteger``)."""
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as folder:
        onnx.save(model, f"{folder}/f.onnx")
        quantize_dynamic(f"{folder}/f.onnx", f"{folder}/q.onnx", weight_type=getattr(QuantType, weight_type))
        return onnx.load(f"{folder}/q.onnx")


def _dynamic_mlp(weight_type: str = "QInt8") -> onnx.ModelProto:
    """x (2, 5, 38) @ W1 (38, 40) + b1, ReLU, @ W2 (40, 24), quantized by ``quantize_dynamic``:
    K 38 not whole groups of 4 bytes, N 40 not whole vectors, rows in two matrices."""
    rng = np.random.default_rng(5)
    inits = [reference._const("w1", rng.standard_normal((38, 40)) * 0.2), reference._const("b1", rng.standard_normal(40)),
             reference._const("w2", rng.standard_normal((40, 24)) * 0.2)]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r1"]), helper.make_node("MatMul", ["r1", "w2"], ["y"])]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 38])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 24])], inits)
    return _dynamically_quantized(model, weight_type)


@pytest.mark.parametrize("weight_type", ["QInt8", "QUInt8"])
def test_dynamic_quantization_multiplies_bytes_as_onnxruntime(weight_type):
    """MatMulInteger's uint8 data and int8 weights stay bytes (its zero point a column-sum offset):
    the products are onnxruntime's integers, the float outputs its own to rounding. Asymmetric uint8
    weights whose shifted values leave int8 stay int32, and the report says why."""
    model = _dynamic_mlp(weight_type)
    assert sum(node.op_type == "MatMulInteger" for node in model.graph.node) == 2
    art = relaxc.compile(model, tuning="off", backends="off")
    summary = art.report()["integer_matmuls"]
    if weight_type == "QInt8":
        assert summary == {"matmuls": 2, "int32": {}}
    else:
        assert summary["matmuls"] + sum(summary["int32"].values()) == 2
        assert set(summary["int32"]) <= {"weights minus their zero point outside int8"}
    session = reference.ort_session(model)
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((2, 5, 38)).astype(np.float32)
        want = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(art.run(x)[0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_dynamic_agreement_is_averaged_over_inputs_beside_onnxruntimes_own():
    """The benchmark's agreement for a dynamically quantized model: every quantized activation
    compared, the share of equal elements averaged over the inputs, the worst over all of them, and
    onnxruntime's unoptimised session measured against its default one the same way."""
    model = with_activations(_dynamic_mlp())
    session = reference.ort_session(model)
    samples = [{"x": np.random.default_rng(seed).standard_normal((2, 5, 38)).astype(np.float32)} for seed in range(3)]

    def one_step_off_on_the_first(sample: dict) -> list[np.ndarray]:
        outputs = session.run(None, sample)
        if sample is samples[0]:
            outputs[1] = outputs[1].copy()
            outputs[1].flat[0] += 1 if outputs[1].flat[0] < 255 else -1
        return outputs

    (equal, worst, relative), own = dynamic_agreements(one_step_off_on_the_first, model, samples, threads=1)
    activations = sum(o.size for o in session.run(None, samples[0])[1:])
    assert len(session.get_outputs()) == 3 and equal == pytest.approx(1 - 1 / activations / len(samples))
    assert worst == 1 and relative == 0
    assert own == (1.0, 0.0, 0.0)  # two matmuls and a ReLU: onnxruntime's kernels round alike either way


def test_dynamically_quantized_convolutions_sum_the_bytes_as_onnxruntime():
    """``ConvInteger`` with a zero point computed at run time (the data is offset, so it is not 0):
    the padded border reads the zero point, the integers are onnxruntime's (its float epilogue
    to rounding), and the grouped convolution sums in float32 exactly."""
    model = _dynamically_quantized(_float_cnn())
    convs = sum(node.op_type == "ConvInteger" for node in model.graph.node)
    assert convs == 5
    art = relaxc.compile(model, tuning="off", backends="off")
    assert art.report()["quantized"]["convolutions"] == convs and art.report()["quantized"]["float"] == {}
    session = reference.ort_session(model)
    for seed in range(3):
        x = (np.random.default_rng(seed).standard_normal((1, 3, 16, 16)) + 1).astype(np.float32)
        want = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(art.run(x)[0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("mcpu", BYTE_DOT_CPUS)
def test_dynamic_matmuls_use_each_cpus_byte_dot_product(mcpu):
    """Compiled for each byte dot product, both products are packed for it and tensorized; where the
    host runs the build, its integers are those of the build of the other CPU that sums bytes as it
    does (equal to the bit), and where its onnxruntime sums them so too, close to its output."""
    model = _dynamic_mlp()
    art = _built_for(model, mcpu)
    assert art.report()["dense"]["packed"] == 2
    _skip_unless_the_host_runs(art)
    x = np.random.default_rng(0).standard_normal((2, 5, 38)).astype(np.float32)
    twin = next(other for other, name in BYTE_DOT_CPUS.items() if other != mcpu and
                ("vpdpbusd" in name) == ("vpdpbusd" in BYTE_DOT_CPUS[mcpu]))
    same = relaxc.compile(model, target={"kind": "llvm", "mcpu": twin, "num-cores": 2}, tuning="off",
                            backends="off")
    if targets.runs_on_host(same.target):
        np.testing.assert_array_equal(art.run(x)[0], same.run(x)[0])
    _skip_unless_onnxruntime_sums_as(art)
    want = reference.ort_session(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(art.run(x)[0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
