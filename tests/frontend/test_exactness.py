"""Shape-dependent refusals (compiler/frontend/exactness.py): refused where TVM would answer wrongly, and
only there: the Resize forms real models use still compile and match onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import relaxc
from tests import reference


def _resize(size_in: tuple[int, int], size_out: tuple[int, int] | None = None, scale: float | None = None,
            **attrs):
    inputs = ["x", "", ""]
    inits = []
    if scale is not None:
        inits.append(numpy_helper.from_array(np.array([1, 1, scale, scale], np.float32), "scales"))
        inputs[2] = "scales"
    else:
        inits.append(numpy_helper.from_array(np.array([1, 2, *size_out], np.int64), "sizes"))
        inputs.append("sizes")
    out = size_out or tuple(int(np.floor(d * scale)) for d in size_in)
    graph = helper.make_graph([helper.make_node("Resize", inputs, ["y"], name="up", **attrs)], "resize",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 2, *size_in))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 2, *out))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


ACCEPTED = [
    dict(size_in=(7, 9), scale=2.0, mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    dict(size_in=(7, 9), scale=2.0, mode="linear", coordinate_transformation_mode="half_pixel"),
    dict(size_in=(8, 8), scale=0.5, mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
    dict(size_in=(7, 9), size_out=(14, 5), mode="linear", coordinate_transformation_mode="align_corners"),
    dict(size_in=(8, 6), size_out=(16, 3), mode="nearest", coordinate_transformation_mode="half_pixel"),
]
REFUSED = [
    (dict(size_in=(7, 9), scale=0.5, mode="linear"), "fractional sizes"),
    (dict(size_in=(7, 9), size_out=(1, 9), mode="linear", coordinate_transformation_mode="align_corners"),
     "align_corners with output size 1 on axis 2"),
    (dict(size_in=(1, 9), size_out=(1, 5), mode="linear", coordinate_transformation_mode="align_corners"),
     "align_corners with output size 1 on axis 2"),  # an axis left at 1 divides by 0 too
    (dict(size_in=(8, 6), size_out=(15, 6), mode="nearest", coordinate_transformation_mode="half_pixel"),
     "from 8 to 15 puts output 7 exactly on a rounding boundary"),
    (dict(size_in=(14, 12), size_out=(4, 3), mode="nearest", coordinate_transformation_mode="asymmetric",
          nearest_mode="floor"), "from 14 to 4 puts output 2 exactly on a rounding boundary"),  # scale 2/7
]


@pytest.mark.parametrize("form", ACCEPTED)
def test_common_resize_forms_compile_and_match(form):
    model = _resize(**form)
    art = relaxc.compile(model, tuning="off")
    inputs = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(model, inputs))


@pytest.mark.parametrize("form, message", REFUSED)
def test_inexact_resize_is_refused_naming_the_node(form, message):
    with pytest.raises(relaxc.UnsupportedOperatorError, match="Resize node 'up'") as err:
        relaxc.compile(_resize(**form), tuning="off", backends="off")
    assert message in str(err.value)
