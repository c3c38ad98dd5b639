"""passes/conv_taps.py: convolution taps that only ever read padding are dropped, outputs unchanged."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import relaxc
from relaxc.passes.conv_taps import _Axis, _input_share, _regions, _useful_taps
from tests import reference


def _conv_model(size, channels, kernel, dilation, pads, stride=1, groups=1):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((channels, channels // groups, kernel, kernel)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[kernel, kernel], dilations=[dilation] * 2,
                            pads=pads, strides=[stride] * 2, group=groups)
    out = (size + pads[0] + pads[2] - dilation * (kernel - 1) - 1) // stride + 1
    return reference._model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, out, out])],
                            [numpy_helper.from_array(weight, "w")])


def test_useful_taps_of_aspp_rates_on_a_small_map():
    """DeepLabV3's ASPP on 14x14: rates 24 and 36 leave the centre tap only, rate 12 all three."""
    assert _useful_taps(_Axis(14, 14, 3, 1, 24, 24)) == (1, 1)
    assert _useful_taps(_Axis(14, 14, 3, 1, 36, 36)) == (1, 1)
    assert _useful_taps(_Axis(14, 14, 3, 1, 12, 12)) == (0, 2)
    assert _useful_taps(_Axis(4, 2, 3, 1, 3, 2)) == (1, 1)  # the first rows are never read: a crop


def test_rate_12_on_a_small_map_splits_into_runs_of_outputs_using_the_same_taps():
    axis = _Axis(14, 14, 3, 1, 12, 12)
    assert _regions(axis) == [(0, 2), (2, 10), (12, 2)]  # centre and below, centre, centre and above
    assert _input_share(axis) == pytest.approx(18 / 42)


@pytest.mark.parametrize("size, channels, kernel, dilation, pads, stride, groups, dropped, regions", [
    (14, 16, 3, 24, [24, 24, 24, 24], 1, 1, 8, 0),     # ASPP rate 24: a 1x1 conv is left
    (14, 16, 3, 12, [12, 12, 12, 12], 1, 1, 56, 9),    # rate 12: 3 x 3 regions, 25 of 81 taps kept
    (4, 8, 3, 3, [2, 2, 2, 2], 1, 1, 8, 0),            # input cropped at both ends
    (9, 8, 3, 6, [6, 6, 6, 0], 2, 1, 17, 3),           # strided, asymmetric: 3 row regions
    (6, 16, 5, 4, [8, 8, 8, 8], 1, 16, 200, 9),        # depthwise 5x5, dilation 4
    (7, 16, 7, 1, [3, 3, 3, 3], 1, 16, 0, 0),          # ConvNeXt's last stage: 7 tap sets per axis, kept whole
])
def test_convolution_without_padding_taps_matches_onnxruntime(size, channels, kernel, dilation, pads, stride,
                                                              groups, dropped, regions):
    model = _conv_model(size, channels, kernel, dilation, pads, stride, groups)
    art = relaxc.compile(model, target="cpu", tuning="off", validate_memory=True)
    report = art.report()["conv_taps"]
    assert (report["taps_dropped"], report["regions"]) == (dropped, regions)
    # the regions' outputs are blocked, so are the concats along H and W (crops of the graph's NCHW
    # input stay NCHW: the conv converts the crop)
    assert set(art.report()["layout"]["standard_op_kinds"]) <= {"relax.strided_slice"}
    x = reference.random_inputs(art.inputs, seed=2)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


def test_regions_of_a_blocked_input_crop_and_concat_blocked():
    """ASPP after a backbone conv: the crops of its blocked output and the concats stay blocked."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"]),
             helper.make_node("Conv", ["c", "w2"], ["y"], kernel_shape=[3, 3], dilations=[12, 12], pads=[12] * 4)]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 14, 14])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 14, 14])],
                             [numpy_helper.from_array(rng.standard_normal((16, 8, 1, 1)).astype(np.float32), "w1"),
                              numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32), "w2")])
    art = relaxc.compile(model, target="cpu", tuning="off")
    assert art.report()["conv_taps"]["regions"] == 9 and art.report()["layout"]["standard_op_kinds"] == {}
    x = reference.random_inputs(art.inputs, seed=3)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))
