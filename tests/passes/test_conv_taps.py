"""passes/conv_taps.py: convolution taps that only ever read padding are dropped, outputs unchanged."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
from passes.conv_taps import _Axis, _useful_taps
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


@pytest.mark.parametrize("size, channels, kernel, dilation, pads, stride, groups, dropped", [
    (14, 16, 3, 24, [24, 24, 24, 24], 1, 1, 8),   # ASPP rate 24: a 1x1 conv is left
    (14, 16, 3, 12, [12, 12, 12, 12], 1, 1, 0),   # rate 12: every tap reads something
    (4, 8, 3, 3, [2, 2, 2, 2], 1, 1, 8),          # input cropped at both ends
    (9, 8, 3, 6, [6, 6, 6, 0], 2, 1, 3),          # strided, asymmetric: the first column of taps goes
    (6, 16, 5, 4, [8, 8, 8, 8], 1, 16, 16),       # depthwise 5x5, dilation 4: the middle 3x3 stays
])
def test_convolution_without_padding_taps_matches_onnxruntime(size, channels, kernel, dilation, pads, stride,
                                                              groups, dropped):
    model = _conv_model(size, channels, kernel, dilation, pads, stride, groups)
    art = compiler.compile(model, target="cpu", tuning="off", validate_memory=True)
    assert art.report()["conv_taps"]["taps_dropped"] == dropped
    x = reference.random_inputs(art.inputs, seed=2)
    reference.assert_matches(art.run(x), reference.ort_run(model, x))
