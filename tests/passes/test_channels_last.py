"""passes/channels_last.py: a channels-last stretch (ConvNeXt's block: permute to NHWC, LayerNorm,
Linear, GELU, Linear, layer scale, permute back) runs in NCHW, then blocked end to end; stretches
whose NHWC values leak, or that never permute back, stay as exported."""

import numpy as np
from onnx import TensorProto, helper

import relaxc
from relaxc import frontend
from relaxc.passes.channels_last import ChannelsLastToNCHW
from tests import reference
from tests.passes import relax_ops

C, HIDDEN, SIZE = 32, 64, 6


def _convnext_block(extra_output: bool = False, permute_back: bool = True):
    rng = np.random.default_rng(0)
    inits = [reference._const("g", rng.uniform(0.5, 1.5, C).astype(np.float32)),
             reference._const("b", rng.standard_normal(C).astype(np.float32)),
             reference._const("w1", rng.standard_normal((C, HIDDEN)).astype(np.float32) / np.sqrt(C)),
             reference._const("b1", rng.standard_normal(HIDDEN).astype(np.float32)),
             reference._const("w2", rng.standard_normal((HIDDEN, C)).astype(np.float32) / np.sqrt(HIDDEN)),
             reference._const("b2", rng.standard_normal(C).astype(np.float32)),
             reference._const("scale", rng.uniform(0.5, 1.5, C).astype(np.float32)),
             reference._const("sqrt2", np.array(np.sqrt(2.0), np.float32)),
             reference._const("one", np.array(1.0, np.float32)), reference._const("half", np.array(0.5, np.float32))]
    inits.append(reference._const("wd", rng.standard_normal((C, 1, 3, 3)).astype(np.float32) / 3))
    nodes = [helper.make_node("Conv", ["x", "wd"], ["d"], group=C, pads=[1, 1, 1, 1]),  # ConvNeXt's depthwise conv
             helper.make_node("Transpose", ["d"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t", "g", "b"], ["ln"], axis=-1, epsilon=1e-6),
             helper.make_node("MatMul", ["ln", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["h"]),
             helper.make_node("Div", ["h", "sqrt2"], ["hs"]), helper.make_node("Erf", ["hs"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["h", "e1"], ["he"]),
             helper.make_node("Mul", ["he", "half"], ["gelu"]),
             helper.make_node("MatMul", ["gelu", "w2"], ["m2"]), helper.make_node("Add", ["m2", "b2"], ["o"]),
             helper.make_node("Mul", ["o", "scale"], ["s"])]
    nchw, nhwc = [1, C, SIZE, SIZE], [1, SIZE, SIZE, C]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, nchw if permute_back else nhwc)]
    if permute_back:
        nodes += [helper.make_node("Transpose", ["s"], ["back"], perm=[0, 3, 1, 2]),
                  helper.make_node("Add", ["back", "d"], ["y"])]
    else:
        nodes += [helper.make_node("Identity", ["s"], ["y"])]
    if extra_output:
        outputs.append(helper.make_tensor_value_info("ln", TensorProto.FLOAT, nhwc))
    return reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, nchw)],
                            outputs, inits)


def test_a_convnext_block_runs_in_nchw_then_blocked_end_to_end():
    model = _convnext_block()
    ops = relax_ops(ChannelsLastToNCHW()(frontend.import_model(model).module))
    assert "relax.permute_dims" not in ops and "relax.matmul" not in ops
    assert ops.count("relax.nn.conv2d") == 3 and "relax.nn.layer_norm" in ops  # the Linears are 1x1 convs
    art = relaxc.compile(model, target="cpu", tuning="off")
    layout = art.report()["layout"]
    assert layout["converters"] == 2 and layout["standard_ops"] == 0, layout  # the graph's input and output
    assert art.report()["schedules"].get("rows", 0) >= 1  # the blocked LayerNorm, pixel by pixel
    x = reference.random_inputs(art.inputs, seed=1)
    x["x"] = x["x"] * 3 + 1  # a mean and a spread over the channels to normalise away
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


def test_a_stretch_whose_nhwc_values_leak_or_that_never_permutes_back_stays():
    for model in (_convnext_block(extra_output=True), _convnext_block(permute_back=False)):
        ops = relax_ops(ChannelsLastToNCHW()(frontend.import_model(model).module))
        assert "relax.permute_dims" in ops and "relax.matmul" in ops
        art = relaxc.compile(model, target="cpu", tuning="off")
        x = reference.random_inputs(art.inputs, seed=1)
        reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))
