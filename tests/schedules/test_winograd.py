"""The Winograd rule: it takes the transforms, Dense takes the products, the epilogue and nothing else
is fused into the output transform, each transform's first stage is computed per tile in a local buffer (the input
transform's padded tile too), and the result is right for both tile sizes."""

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tvm import tirx

import relaxc
from relaxc.schedules.default import schedule_kind
from tests import reference
from tests.helpers import store_choosing


@pytest.mark.parametrize("choice", ["winograd2", "winograd4"])
def test_transforms_and_products_get_their_rules(tmp_path, choice):
    model = reference.conv3x3(32, 48, 10, 10, 1, residual=False)
    art = relaxc.compile(model, tuning="off", cache_dir=store_choosing(tmp_path, model, choice))
    kinds = {gv.name_hint: schedule_kind(f) for gv, f in art.module("final").functions.items()
             if isinstance(f, tirx.PrimFunc) and "winograd" in gv.name_hint}
    assert kinds == {"winograd_input": "winograd", "winograd_product": "dense",
                     "fused_winograd_output_add_relu": "winograd"}  # bias and ReLU fused into the output transform
    for kernel, stage in (("winograd_input", "winograd_input_rows"), ("winograd_input", "data_pad_local"),
                          ("fused_winograd_output_add_relu", "winograd_output_columns")):
        script = art.module("final")[kernel].script()
        buffer = stage.removesuffix("_local") + "_local"
        assert re.search(rf'{buffer} = T\.sblock_alloc_buffer\([^\n]*scope="local"', script)
        assert script.index("T.parallel(") < script.index(f'T.sblock("{stage}")')  # per tile, not the whole tensor
    assert 'T.sblock("data_pad")' not in art.module("final")["winograd_input"].script()  # no padded copy first
    x = np.random.default_rng(2).standard_normal((1, 32, 10, 10)).astype(np.float32)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, {"x": x}))


def _two_convolutions(chained: bool) -> onnx.ModelProto:
    """Two 3x3 convolutions + bias + ReLU of 32 channels on 12x12: one after the other (VGG) or side
    by side, concatenated (GoogLeNet)."""
    rng = np.random.default_rng(3)
    consts = [reference._const(n, rng.standard_normal(s) / (np.sqrt(288) if n.startswith("w") else 1))
              for n, s in (("w1", (32, 32, 3, 3)), ("b1", (32,)), ("w2", (32, 32, 3, 3)), ("b2", (32,)))]
    second = "r1" if chained else "x"
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", [second, "w2", "b2"], ["c2"], pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["r2"])]
    if not chained:
        nodes.append(helper.make_node("Concat", ["r1", "r2"], ["y"], axis=1))
    out = ("r2", 32) if chained else ("y", 64)
    return reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 12, 12])],
                            [helper.make_tensor_value_info(out[0], TensorProto.FLOAT, [1, out[1], 12, 12])], consts)


@pytest.mark.parametrize("chained", [True, False], ids=["chained", "concatenated"])
def test_output_transforms_fuse_as_convolutions(tmp_path, chained):
    """An output transform takes its epilogue and nothing else: neither the next convolution's input
    transform (VGG) nor a concat of several output transforms (GoogLeNet) shares its kernel, which
    was slow to build that way."""
    model = _two_convolutions(chained)
    art = relaxc.compile(model, tuning="off", cache_dir=store_choosing(tmp_path, model, "winograd4"))
    kernels = {gv.name_hint: f for gv, f in art.module("final").functions.items() if isinstance(f, tirx.PrimFunc)}
    outputs = [name for name in kernels if "winograd_output" in name]
    assert outputs and all(name == "fused_winograd_output_add_relu" for name in outputs), outputs
    assert all(schedule_kind(f) in ("winograd", "dense") for name, f in kernels.items() if "winograd" in name)
    if not chained:
        assert "concatenate" in kernels  # a kernel of its own
    x = np.random.default_rng(4).standard_normal((1, 32, 12, 12)).astype(np.float32)
    want = reference.ort_run(model, {"x": x})
    assert want[0].std() > 0.1
    reference.assert_matches(reference.relaxc_run(art, x), want)
