"""1-D convolutions run as 2-D ones over a height of 1 (``Conv1dAsConv2d``,
``passes/canonicalize/convolutions.py``): the blocked convolution path, their bias and activation
fused with them; against onnxruntime for strides, padding, groups, dilation and large kernels."""

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import relaxc
from tests import reference


def _conv1d(c_in: int, c_out: int, length: int, kernel: int, stride: int, pad: int, group: int = 1,
            dilation: int = 1, seed: int = 0):
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((c_out, c_in // group, kernel)) / np.sqrt(c_in * kernel / group)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[kernel], strides=[stride], pads=[pad, pad],
                              group=group, dilations=[dilation]),
             helper.make_node("Relu", ["c"], ["out"])]
    out = (length + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    return reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c_in, length])],
                            [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, c_out, out])],
                            [numpy_helper.from_array(weight.astype(np.float32), "w"),
                             numpy_helper.from_array(rng.standard_normal(c_out).astype(np.float32), "b")], 17)


@pytest.mark.parametrize("c_in, c_out, length, kernel, stride, pad, group, dilation", [
    (1, 32, 400, 10, 5, 0, 1, 1),  # an audio front end's first convolution
    (16, 24, 99, 3, 2, 1, 1, 1),
    (48, 48, 49, 32, 1, 16, 16, 1),  # a grouped positional convolution with a long kernel
    (16, 16, 60, 3, 1, 2, 16, 2),  # depthwise, dilated (16 channels: one whole block on AVX-512 too)
])
def test_conv1d_takes_the_blocked_convolution_path(c_in, c_out, length, kernel, stride, pad, group, dilation):
    model = _conv1d(c_in, c_out, length, kernel, stride, pad, group, dilation)
    art = relaxc.compile(model, target="cpu", tuning="off")
    fused = art.ir("fuse")
    assert "conv1d" not in fused and re.search(r"fused_conv2d_NCHWc\w*_add\w*_relu", fused)  # blocked, with its epilogue
    x = reference.random_inputs(art.inputs, seed=1)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


@pytest.mark.parametrize("length, stride, width", [(1599, 2, 799), (103, 1, 101)])
def test_an_output_width_no_row_tile_divides_is_computed_padded_then_sliced(length, stride, width):
    """799 and 101 have no factor from 4 to 8 (an audio front end's widths are odd, often prime): the
    convolution computes 800 or 104 columns from zero padding, so its schedule tiles rows of 8 or 4
    columns and output channel blocks (a tile of one column: 20 % of the roofline), then slices."""
    model = _conv1d(16, 32, length, 3, stride, 0)
    art = relaxc.compile(model, target="cpu", tuning="off")
    fused = art.ir("fuse")
    padded = -(-width // 8) * 8
    assert re.search(rf"conv2d_NCHWc\w* = T.sblock_alloc_buffer\(\(T.int64\(2\), T.int64\(\d+\), T.int64\(1\), T.int64\({padded}\)", fused)
    assert "strided_slice" in fused
    x = reference.random_inputs(art.inputs, seed=3)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))
