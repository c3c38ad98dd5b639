"""Every kind of bad input gets a clear UserError, raised before compile work, leaving nothing behind."""

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import relaxc
from relaxc.frontend import relax_import
from relaxc.support.errors import message
from tests import reference


def _write(path, data: bytes):
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("error, last, expected", [
    (ValueError("first\n  second  \n\n"), False, "first"),
    (ValueError("first\n  second  \n\n"), True, "second"),
    (RuntimeError(""), True, "RuntimeError"),  # no text: the error's kind
    ("", False, ""),
    (KeyError("x" * 400), False, "'" + "x" * 299),
])
def test_an_error_is_quoted_by_one_line_of_its_text(error, last, expected):
    assert message(error, last) == expected


def test_missing_file():
    with pytest.raises(relaxc.ModelError, match="model file not found: /no/such/model.onnx"):
        relaxc.compile("/no/such/model.onnx")


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(relaxc.ModelError, match="is a directory"):
        relaxc.compile(str(tmp_path))


def test_not_an_onnx_file(tmp_path):
    path = _write(tmp_path / "notes.onnx", b"these are not the weights you are looking for\n")
    with pytest.raises(relaxc.ModelError, match="not (a readable )?(an )?ONNX model"):
        relaxc.compile(path)


def test_truncated_protobuf(tmp_path):
    data = reference.small_cnn().SerializeToString()
    path = _write(tmp_path / "cut.onnx", data[: len(data) // 2])
    with pytest.raises(relaxc.ModelError, match="cut.onnx is not"):
        relaxc.compile(path)


def test_unknown_bundled_model():
    with pytest.raises(relaxc.ModelError, match="unknown bundled model 'onnx:resnet18'.*onnx:resnet50"):
        relaxc.compile("onnx:resnet18")


def test_checker_failure_says_why():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    node = helper.make_node("Add", ["x", "ghost"], ["y"], name="add_ghost")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(relaxc.ModelError, match="fails the ONNX checker: .*ghost"):
        relaxc.compile(model)


def test_all_unsupported_operators_listed_before_import(monkeypatch):
    monkeypatch.setattr(relax_import, "from_onnx", lambda *a, **k: pytest.fail("import ran"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [
        helper.make_node("Det", ["x"], ["a"], name="det_1"),  # no converter, no ONNX function body
        helper.make_node("Relu", ["a"], ["b"], name="relu_ok"),
        helper.make_node("Det", ["b"], ["c"], name="det_2"),
        helper.make_node("LpNormalization", ["c"], ["d"], name="lpnorm"),
        helper.make_node("Frobnicate", ["d"], ["y"], name="custom", domain="com.example"),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.raises(relaxc.UnsupportedOperatorError) as info:
        relaxc.compile(model, backends="off")
    message = str(info.value)
    assert "3 unsupported operator type(s)" in message
    assert "Det (nodes: det_1, det_2)" in message
    assert "LpNormalization (nodes: lpnorm)" in message
    assert "com.example::Frobnicate (nodes: custom)" in message
    assert "Relu" not in message


def test_an_op_the_importer_gets_wrong_is_refused_with_the_reason(monkeypatch):
    """NonMaxSuppression converts, but to a static (and wrong) output shape: refused, never run."""
    monkeypatch.setattr(relax_import, "from_onnx", lambda *a, **k: pytest.fail("import ran"))
    boxes = helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 6, 4])
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, 6])
    picked = helper.make_tensor_value_info("picked", TensorProto.INT64, [None, 3])
    nms = helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["picked"], name="nms")
    model = helper.make_model(helper.make_graph([nms], "g", [boxes, scores], [picked]),
                              opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(relaxc.UnsupportedOperatorError,
                       match=r"NonMaxSuppression node .nms.: its data-dependent output shape is made static"):
        relaxc.compile(model, backends="off")


def _dynamic_model():
    model = reference.small_cnn()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    return model


def test_dynamic_dim_without_shapes_names_input_and_dim():
    with pytest.raises(relaxc.ShapeError, match=r"input 'x' has a dynamic dimension 0 \('batch'\)"):
        relaxc.compile(_dynamic_model())


@pytest.mark.parametrize("shapes, message", [
    ({"y": (1, 3, 32, 32)}, r"unknown input\(s\) \['y'\]"),
    ({"x": (1, 3, 32)}, "has rank 4, but shapes gives 3 dims"),
    ({"x": (2, 4, 32, 32)}, "dim 1 is fixed to 3 in the model, but shapes gives 4"),
])
def test_bad_shape_bindings(shapes, message):
    with pytest.raises(relaxc.ShapeError, match=message):
        relaxc.compile(_dynamic_model(), shapes=shapes)


@pytest.mark.parametrize("target, message", [
    ("cuda9", "unknown target 'cuda9'"),
    ({"kind": "nope"}, 'invalid target {"kind": "nope"}'),
    ({"kind": "llvm", "mcpu": "pentium9"}, "LLVM does not know the CPU 'pentium9'"),
    ("{not json", "not valid JSON"),
    ({"kind": "metal"}, "target kind 'metal' is not supported; relaxc compiles for llvm, cuda, rocm"),
])
def test_unknown_target(target, message):
    with pytest.raises(relaxc.TargetError, match=message):
        relaxc.compile(reference.small_cnn(), target=target)


def test_bad_tuning_mode():
    with pytest.raises(relaxc.UserError, match="tuning must be one of"):
        relaxc.compile(reference.small_cnn(), tuning="fast")


@pytest.fixture(scope="module")
def small_artifact():
    return relaxc.compile(reference.small_cnn())


def test_run_with_wrong_name(small_artifact):
    with pytest.raises(relaxc.InputError, match=r"unknown \['image'\], missing \['x'\]; expected \['x'\]"):
        small_artifact.run({"image": np.zeros((1, 3, 32, 32), np.float32)})


def test_run_with_wrong_shape(small_artifact):
    with pytest.raises(relaxc.InputError, match=r"input 'x': expected shape \(1, 3, 32, 32\), got \(1, 3, 224, 224\)"):
        small_artifact.run(np.zeros((1, 3, 224, 224), np.float32))


def test_run_with_wrong_dtype(small_artifact):
    with pytest.raises(relaxc.InputError, match="input 'x': expected dtype float32, got float64"):
        small_artifact.run(np.zeros((1, 3, 32, 32)))


def test_run_with_wrong_count(small_artifact):
    x = np.zeros((1, 3, 32, 32), np.float32)
    with pytest.raises(relaxc.InputError, match=r"model takes 1 input\(s\) \['x'\], got 2"):
        small_artifact.run(x, x)


def _misaligned(x: np.ndarray) -> np.ndarray:
    """``x`` copied into memory 4 bytes past an allocation's start."""
    raw = np.empty(x.nbytes + 4, np.uint8)
    view = raw[4:].view(x.dtype).reshape(x.shape)
    view[...] = x
    return view


def test_any_numpy_memory_form_gives_the_same_answer(small_artifact):
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    expected = small_artifact.run(x)[0]
    read_only = x.copy()
    read_only.flags.writeable = False
    forms = {"Fortran order": np.asfortranarray(x), "strided view": np.repeat(x, 2, axis=3)[..., ::2],
             "transposed view": np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2),
             "misaligned": _misaligned(x), "read-only": read_only, "big-endian": x.astype(">f4")}
    for name, form in forms.items():
        before = form.copy()
        np.testing.assert_array_equal(small_artifact.run(form)[0], expected, err_msg=name)
        np.testing.assert_array_equal(form, before, err_msg=name)  # the caller's array is left alone
    with pytest.raises(relaxc.InputError, match="expected dtype float32, got >f8"):
        small_artifact.run(x.astype(">f8"))


def test_nan_and_infinities_pass_through_as_in_onnxruntime():
    """ReLU and Clip keep a NaN (x86's max alone would turn it into the bound); Conv, pools,
    Softmax and the activations propagate NaN and infinities as onnxruntime does."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    x[0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
    x[0, 3, 2, 2] = np.nan
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Clip", ["x", "lo", "hi"], ["k"]), helper.make_node("Sigmoid", ["x"], ["s"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[1, 1]),
             helper.make_node("Softmax", ["x"], ["m"], axis=1)]
    outputs = ["c", "r", "k", "s", "p", "m"]
    graph = helper.make_graph(nodes, "nan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 8, 6, 6))],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, (1, 8, 6, 6)) for o in outputs],
                              [numpy_helper.from_array(rng.standard_normal((8, 8, 1, 1)).astype(np.float32), "w"),
                               numpy_helper.from_array(np.array(0, np.float32), "lo"),
                               numpy_helper.from_array(np.array(6, np.float32), "hi")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = reference.ORT_MAX_IR_VERSION
    ours = relaxc.compile(model, tuning="off").run(x)
    for name, got, expected in zip(outputs, ours, reference.ort_run(model, {"x": x})):
        assert np.isnan(expected).any(), name  # the case is there
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=name)  # NaN where it has NaN


def test_a_quantized_nan_is_the_lowest_value_as_in_onnxruntime():
    """A softmax over a fully masked row is 0/0: its QuantizeLinear gives the type's lowest value as
    onnxruntime's does, on every CPU (the clamp's NaN reached LLVM's float-to-integer conversion,
    which is poison: Zen 4 and Zen 5 code read garbage there), fused with what follows or not."""
    x = np.random.default_rng(1).standard_normal((1, 4, 16, 128)).astype(np.float32)
    x[0, 1] = -np.inf  # every row of a head masked
    x[0, 2, 3, 5] = np.nan
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=-1),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("IsNaN", ["d"], ["n"]),  # as attention masks are written: a NaN-free DQ needs none
             helper.make_node("Where", ["n", "zero", "d"], ["w"]),
             helper.make_node("QuantizeLinear", ["w", "s2", "z"], ["q2"]),
             helper.make_node("DequantizeLinear", ["q2", "s2", "z"], ["y"]),
             helper.make_node("QuantizeLinear", ["x", "s", "zs"], ["qs"])]
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 4, 16, 128))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 4, 16, 128)),
                               helper.make_tensor_value_info("qs", TensorProto.INT8, (1, 4, 16, 128))],
                              [numpy_helper.from_array(np.array(1 / 255, np.float32), "s"),
                               numpy_helper.from_array(np.array(3, np.uint8), "z"),
                               numpy_helper.from_array(np.array(-2, np.int8), "zs"),
                               numpy_helper.from_array(np.array(0, np.float32), "zero"),
                               numpy_helper.from_array(np.array(6e-5, np.float32), "s2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = reference.ORT_MAX_IR_VERSION
    expected = reference.ort_run(model, {"x": x})
    assert np.allclose(expected[0][0, 1], -3 * 6e-5) and expected[1][0, 2, 3, 5] == -128  # the case is there
    for got, want in zip(relaxc.compile(model, tuning="off").run(x), expected):
        np.testing.assert_array_equal(got, want)


def test_export_to_missing_directory(small_artifact, tmp_path):
    with pytest.raises(relaxc.ExportError, match="does not exist"):
        small_artifact.export(tmp_path / "nope" / "m.so")
    assert os.listdir(tmp_path) == []


def test_export_onto_a_directory_leaves_nothing(small_artifact, tmp_path):
    (tmp_path / "m.so").mkdir()
    with pytest.raises(relaxc.ExportError, match="cannot export to"):
        small_artifact.export(tmp_path / "m.so")
    assert os.listdir(tmp_path) == ["m.so"] and os.listdir(tmp_path / "m.so") == []


def test_export_failing_midway_leaves_nothing(small_artifact, tmp_path, monkeypatch):
    def half_written(path, **_options):  # the launcher object comes as addons
        with open(path, "wb") as f:
            f.write(b"\x7fELF partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(small_artifact.executable, "export_library", half_written, raising=False)
    with pytest.raises(relaxc.ExportError, match="No space left on device"):
        small_artifact.export(tmp_path / "m.so")
    assert os.listdir(tmp_path) == []


def test_load_without_manifest(small_artifact, tmp_path):
    small_artifact.export(tmp_path / "m.so")
    os.unlink(tmp_path / "m.json")
    with pytest.raises(relaxc.ExportError, match="manifest .*m.json is missing"):
        relaxc.load(tmp_path / "m.so")


def test_load_missing_library(tmp_path):
    with pytest.raises(relaxc.ExportError, match="no artifact at"):
        relaxc.load(tmp_path / "absent.so")


def test_load_unknown_device(small_artifact, tmp_path):
    small_artifact.export(tmp_path / "m.so")
    with pytest.raises(relaxc.UserError, match="unknown device 'tpu'"):
        relaxc.load(tmp_path / "m.so", device="tpu")
