"""The layout pass on its own: padding arithmetic, converter insertion, reuse and cancellation,
fallback on operators it does not know, idempotence; and ResNet-50's blocked layout."""

import re
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import GenericConst

import relaxc
from relaxc import frontend
from relaxc.build import pipeline
from relaxc.passes.layout import LayoutPass
from relaxc.passes.layout_algebra import (block_constant, blocked, input_block, pack_conv_weight, pack_windowed_conv_weight,
                                         window_firsts)
from relaxc.passes.ir import static_shape
from relaxc.passes.legalize import legalize_ops
from relaxc.support import targets
from tests import helpers, reference

RNG = np.random.default_rng(0)


def _bindings(mod: tvm.IRModule) -> dict:
    return {b.var: b.value for block in mod["main"].body.blocks for b in block.bindings}


def _calls(mod: tvm.IRModule, op: str) -> list[relax.Call]:
    return [v for v in _bindings(mod).values()
            if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name == op]


def _inverse_pairs(mod: tvm.IRModule) -> list[relax.Var]:
    """Converters whose input comes straight from another converter (through a slice at most)."""
    bound = _bindings(mod)

    def producer(expr):
        value = bound.get(expr)
        if isinstance(value, relax.Call) and value.op.name == "relax.strided_slice":
            value = bound.get(value.args[0])
        return value

    pairs = []
    for var, value in bound.items():
        if isinstance(value, relax.Call) and value.op.name == "relax.layout_transform":
            source = producer(value.args[0])
            if isinstance(source, relax.Call) and source.op.name == "relax.layout_transform":
                pairs.append(var)
    return pairs


def _conv_module(channels: int = 20, consumers=("softmax",), prefix=None) -> tvm.IRModule:
    """x -> [prefix(x)] -> conv(channels) + bias -> relu -> each consumer; returns a tuple if several."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, 8, 8), "float32"))
    weight = relax.const(RNG.standard_normal((channels, channels, 3, 3)).astype("float32") * 0.2)
    bias = relax.const(RNG.standard_normal((1, channels, 1, 1)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            data = prefix(bb, x) if prefix else x
            conv = bb.emit(relax.op.nn.conv2d(data, weight, padding=1))
            act = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(conv, bias))))
            outs = []
            for consumer in consumers:
                if consumer == "softmax":
                    outs.append(bb.emit(relax.op.nn.softmax(act, axis=1)))
                elif consumer == "channel_mean":
                    outs.append(bb.emit(relax.op.mean(act, axis=[1], keepdims=True)))
                elif consumer == "resize":
                    outs.append(bb.emit(relax.op.image.resize2d(act, (16, 16))))
            out = bb.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, x: np.ndarray) -> list[np.ndarray]:
    target = tvm.target.Target({"kind": "llvm"})
    built = tvm.compile(legalize_ops(target)(mod), target=target)
    result = relax.VirtualMachine(built, tvm.cpu())["main"](tvm.runtime.tensor(x))
    return [result.numpy()] if isinstance(result, tvm.runtime.Tensor) else [r.numpy() for r in result]


def _apply(mod: tvm.IRModule, block: int = 8):
    layout_pass = LayoutPass(block)
    return layout_pass(mod), layout_pass.summary()


# --- padding arithmetic ------------------------------------------------------------------------

def test_channels_pad_to_whole_blocks():
    assert [blocked(8).padded(c) for c in (1, 3, 8, 20, 44, 92)] == [8, 8, 8, 24, 48, 96]
    assert blocked(16).padded(20) == 32
    assert [input_block(c, 8) for c in (1, 2, 3, 4, 5, 20)] == [1, 2, 3, 4, 8, 8]
    assert input_block(3, 16) == 3 and input_block(8, 16) == 8 and input_block(9, 16) == 16


@pytest.mark.parametrize("out_ch, in_ch, groups, in_block, shape, layout", [
    (20, 3, 1, 4, (3, 1, 3, 3, 4, 8), "OIHW4i8o"),     # the stem: 3 -> 4 lanes in, 20 -> 24 out
    (44, 92, 1, 8, (6, 12, 3, 3, 8, 8), "OIHW8i8o"),
    (32, 16, 2, 8, (4, 2, 3, 3, 8, 8), "OIHW8i8o"),    # grouped, whole blocks per group
])
def test_conv_weights_are_packed_and_zero_padded(out_ch, in_ch, groups, in_block, shape, layout):
    weight = RNG.standard_normal((out_ch, in_ch, 3, 3)).astype("float32")
    kernel, kernel_layout, new_groups = pack_conv_weight(weight, groups, in_block, 8)
    assert kernel.shape == shape and kernel_layout == layout and new_groups == groups
    for o in range(kernel.shape[0] * 8):
        for i in range(kernel.shape[1] * in_block):
            got = kernel[o // 8, i // in_block, :, :, i % in_block, o % 8]
            if o < out_ch and i < in_ch:
                np.testing.assert_array_equal(got, weight[o, i])
            else:
                assert not got.any(), f"padding at out {o}, in {i} is not zero"


def test_depthwise_weights_pad_groups_with_channels():
    weight = RNG.standard_normal((44, 1, 3, 3)).astype("float32")
    kernel, layout, groups = pack_conv_weight(weight, 44, 8, 8)
    assert kernel.shape == (6, 1, 3, 3, 1, 8) and layout == "OIHW1i8o" and groups == 48
    np.testing.assert_array_equal(kernel[43 // 8, 0, :, :, 0, 43 % 8], weight[43, 0])
    assert not kernel[5, 0, :, :, 0, 4:].any()


@pytest.mark.parametrize("groups, per_group, merged", [(12, 4, 6), (5, 4, 3)])  # 5 groups: a zero group pads the last
def test_groups_narrower_than_a_block_merge_into_block_diagonal_groups(groups, per_group, merged):
    weight = RNG.standard_normal((groups * per_group, per_group, 3, 3)).astype("float32")
    kernel, layout, new_groups = pack_conv_weight(weight, groups, 8, 8)
    assert kernel.shape == (merged, 1, 3, 3, 8, 8) and layout == "OIHW8i8o" and new_groups == merged
    for o in range(merged * 8):
        for i in range(8):  # input lane i of output channel o's merged group
            got = kernel[o // 8, 0, :, :, i, o % 8]
            same_group = o < groups * per_group and i // per_group == (o // per_group) % 2
            if same_group:
                np.testing.assert_array_equal(got, weight[o, i % per_group])
            else:
                assert not got.any(), f"out {o}, lane {i}: another group's weight is not zero"


def test_grouped_conv_splitting_a_block_is_not_packed_as_whole_groups():
    assert pack_conv_weight(np.zeros((48, 11, 1, 1), "float32"), 4, 8, 8) is None


def test_groups_are_not_merged_where_the_zero_groups_would_add_output_blocks():
    # 5 groups of 2 -> 8 channels: merged by 4 into 2 groups of 32 outputs, 8 blocks for 40 channels' 5
    assert pack_conv_weight(np.zeros((40, 2, 3, 3), "float32"), 5, 8, 8) is None


@pytest.mark.parametrize("out_channels, groups, in_per_group, firsts, width", [
    (136, 4, 34, [0, 0, 0, 2, 2, 4, 4, 4, 4], 5),  # ShuffleNet: 34-channel groups; the last windows moved back
    (48, 4, 11, [0, 0, 0], 3),  # 11 channels per group: a window as wide as the input, all from block 0
    (64, 64, 1, [0, 1, 2, 3], 1),  # depthwise: one block each
])
def test_windows_cover_the_groups_of_each_output_block(out_channels, groups, in_per_group, firsts, width):
    in_blocks = -(-groups * in_per_group // 16)
    assert window_firsts(out_channels, groups, in_per_group, 16, in_blocks) == (firsts, width)


def test_windowed_weights_sit_at_their_input_channels():
    weight = RNG.standard_normal((48, 11, 3, 3)).astype("float32")
    kernel = pack_windowed_conv_weight(weight, 4, 16, 3)
    firsts, width = window_firsts(48, 4, 11, 16, 3)
    assert kernel.shape == (3, width, 3, 3, 16, 16)
    for o in range(48):
        for i in range(width * 16):
            channel = (firsts[o // 16] * 16) + i  # the input channel window position i reads
            got = kernel[o // 16, i // 16, :, :, i % 16, o % 16]
            group = o // 12
            if group * 11 <= channel < (group + 1) * 11:
                np.testing.assert_array_equal(got, weight[o, channel - group * 11])
            else:
                assert not got.any(), f"out {o}, input {channel}: outside the group but not zero"


def test_per_channel_constants_are_blocked_with_their_pad_value():
    value = RNG.standard_normal((20, 1, 1)).astype("float32")
    laid = block_constant(value, 20, blocked(8), 1.0)
    assert laid.shape == (1, 3, 1, 1, 8)
    np.testing.assert_array_equal(laid[0, 19 // 8, 0, 0, 19 % 8], value[19, 0, 0])
    assert (laid[0, 2, 0, 0, 4:] == 1.0).all()
    assert block_constant(np.float32(2.0), 20, blocked(8), 0.0).shape == ()
    assert block_constant(np.ones((1, 1, 8, 8), "float32"), 20, blocked(8), 0.0).shape == (1, 1, 8, 8, 1)
    assert block_constant(np.ones((1, 7, 1, 1), "float32"), 20, blocked(8), 0.0) is None


# --- converters --------------------------------------------------------------------------------

def test_converters_only_where_producer_and_consumer_disagree():
    mod = _conv_module(20, consumers=("softmax",))
    new, stats = _apply(mod)
    assert stats["converters"] == 2  # into the conv (padded 20 -> 24), out of it before the softmax
    assert stats["blocked_ops"] == 3 and stats["standard_ops"] == 1  # conv, add, relu | softmax
    assert [t["from"] for t in stats["padded_tensors"]] == [20, 20] and stats["padding_bytes"] > 0
    (conv,) = _calls(new, "relax.nn.conv2d")
    assert conv.attrs.data_layout == "NCHW8c" and conv.attrs.out_layout == "NCHW8c"
    (slice_,) = _calls(new, "relax.strided_slice")  # padding sliced off before the softmax
    assert [int(d) for d in slice_.ty.shape.values] == [1, 20, 8, 8]
    x = RNG.standard_normal((1, 20, 8, 8)).astype("float32")
    np.testing.assert_allclose(_run(new, x)[0], _run(mod, x)[0], rtol=1e-5, atol=1e-6)


def test_one_converted_value_serves_every_consumer():
    mod = _conv_module(16, consumers=("softmax", "channel_mean"))
    new, stats = _apply(mod)
    assert stats["converters"] == 2 and len(_calls(new, "relax.layout_transform")) == 2
    assert not _calls(new, "relax.strided_slice")  # 16 channels: nothing padded
    x = RNG.standard_normal((1, 16, 8, 8)).astype("float32")
    for got, want in zip(_run(new, x), _run(mod, x)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _round_trip(bb: relax.BlockBuilder, x: relax.Var) -> relax.Var:
    """x to NCHW8c and straight back, as another pass or a previous run might leave it."""
    layout = blocked(8)
    there = bb.emit(layout.from_standard(x))
    back = bb.emit(relax.op.layout_transform(there, layout.to_standard_map()))
    return bb.emit(relax.op.strided_slice(back, axes=[1], begin=[0], end=[20]))


def test_inverse_converter_pairs_cancel():
    mod = _conv_module(20, prefix=_round_trip)
    assert len(_inverse_pairs(mod)) == 1
    new, stats = _apply(mod)
    assert stats["cancelled_pairs"] == 1
    assert _inverse_pairs(new) == []
    assert len(_calls(new, "relax.layout_transform")) == 2  # in to the conv, out to the softmax
    x = RNG.standard_normal((1, 20, 8, 8)).astype("float32")
    np.testing.assert_allclose(_run(new, x)[0], _run(mod, x)[0], rtol=1e-5, atol=1e-6)


def test_unknown_operator_gets_standard_unpadded_data():
    mod = _conv_module(20, consumers=("channel_mean",))
    new, stats = _apply(mod)
    (mean,) = _calls(new, "relax.mean")
    assert [int(d) for d in mean.args[0].ty.shape.values] == [1, 20, 8, 8]
    assert stats["standard_op_kinds"] == {"relax.mean": 1}
    x = RNG.standard_normal((1, 20, 8, 8)).astype("float32")
    np.testing.assert_allclose(_run(new, x)[0], _run(mod, x)[0], rtol=1e-5, atol=1e-6)


def test_a_resize_inside_the_graph_runs_blocked_and_one_that_leaves_it_stays_nchw():
    def then_conv(bb, x):  # the resize's result feeds a conv: it stays inside the graph
        weight = relax.const(RNG.standard_normal((20, 20, 1, 1)).astype("float32"))
        return bb.emit(relax.op.nn.conv2d(bb.emit(relax.op.image.resize2d(x, (8, 8))), weight))

    inner = _conv_module(20, prefix=lambda bb, x: then_conv(bb, bb.emit(relax.op.nn.conv2d(
        x, relax.const(RNG.standard_normal((20, 20, 1, 1)).astype("float32")), data_layout="NCHW"))))
    new, stats = _apply(inner)
    (resize,) = _calls(new, "relax.image.resize2d")
    assert resize.attrs.layout == "NCHW8c" and "relax.image.resize2d" not in stats["standard_op_kinds"]
    x = RNG.standard_normal((1, 20, 8, 8)).astype("float32")
    reference.assert_matches(_run(new, x), _run(inner, x))  # three convs summed in other orders, then a softmax
    # the function's output (bound to it directly, as simplify leaves it): converted before the upsampling
    leaving = relax.transform.CanonicalizeBindings()(_conv_module(20, consumers=("resize",)))
    new, stats = _apply(leaving)
    (resize,) = _calls(new, "relax.image.resize2d")
    assert resize.attrs.layout == "NCHW" and [int(d) for d in resize.args[0].ty.shape.values] == [1, 20, 8, 8]
    np.testing.assert_allclose(_run(new, x)[0], _run(leaving, x)[0], rtol=1e-5, atol=1e-6)


def _simplified(model) -> tvm.IRModule:
    imported = frontend.import_model(model, None)
    compilation = SimpleNamespace(config=SimpleNamespace(target=targets.resolve("cpu")), model=imported)
    return tvm.transform.Sequential(pipeline._simplify(compilation))(imported.module)


@pytest.mark.parametrize("build", [reference.small_cnn, reference.branchy_cnn, reference.blocked_paths_cnn])
def test_pass_is_idempotent(build):
    once, first = _apply(_simplified(build()))
    twice, second = _apply(once)
    assert first["blocked_ops"] > 0
    assert tvm_ffi.structural_equal(once, twice)
    assert second["converters"] == 0 and second["blocked_ops"] == 0


def test_block_zero_leaves_the_module_alone():
    mod = _conv_module(20)
    new, stats = _apply(mod, block=0)
    assert tvm_ffi.structural_equal(new, mod) and stats["block"] == 0 and stats["blocked_ops"] == 0


def test_clip_and_a_conv_with_groups_split_by_blocks_stay_blocked():
    art = relaxc.compile(reference.branchy_cnn(), layout_block=8)
    report = art.report()["layout"]
    # Clip (imported as TIR max/min) stays blocked, and so does the 4-group conv with 11 channels
    # per group (windows of input blocks); only the channel softmax runs in NCHW
    assert report["standard_op_kinds"] == {"relax.nn.softmax": 1}
    inputs = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(reference.branchy_cnn(), inputs))


def test_a_conv_with_groups_narrower_than_the_block_runs_blocked():
    """RegNet's shape: 13 groups of 8 channels (104, padded to 112) on 16-lane blocks."""
    rng = np.random.default_rng(3)
    model = reference._model(
        [onnx.helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
         onnx.helper.make_node("Relu", ["c1"], ["r"]),
         onnx.helper.make_node("Conv", ["r", "wg"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2], group=13)],
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 12, 12])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 104, 6, 6])],
        [reference._const("w1", rng.standard_normal((104, 8, 3, 3)) * 0.3),
         reference._const("wg", rng.standard_normal((104, 8, 3, 3)) * 0.3)])
    art = relaxc.compile(model, layout_block=16)
    convs = _calls(art.module("layout"), "relax.nn.conv2d")
    assert [c.attrs.data_layout for c in convs] == ["NCHW8c", "NCHW16c"] and convs[1].attrs.groups == 7
    inputs = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(model, inputs))


def test_concat_after_whole_blocks_stays_blocked():
    art = relaxc.compile(reference.blocked_paths_cnn(), layout_block=16)
    concats = _calls(art.module("layout"), "relax.concat")
    # 32 + 20 channels: the padded part is last, its padding ends the concat
    assert concats and all(len(c.ty.shape.values) == 5 for c in concats)
    inputs = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(reference.blocked_paths_cnn(), inputs))


def _shufflenet_v2_unit(channels: int = 116, chunked: bool = False) -> onnx.ModelProto:
    """ShuffleNetV2's unit, as torchvision exports it: split the channels in half (58 and 58: not
    whole 16-lane blocks), a conv on one half, concat, shuffle (reshape, transpose, reshape);
    ``chunked``: then the next unit's split of the shuffled channels, the halves subtracted."""
    rng = np.random.default_rng(4)
    half = channels // 2
    ints = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
    nodes = [
        onnx.helper.make_node("Conv", ["x", "w1"], ["c"]),
        onnx.helper.make_node("Slice", ["c", "zero", "half", "one"], ["a"]),
        onnx.helper.make_node("Slice", ["c", "half", "all", "one"], ["b"]),
        onnx.helper.make_node("Conv", ["b", "w2"], ["b2"]),
        onnx.helper.make_node("Relu", ["b2"], ["b3"]),
        onnx.helper.make_node("Concat", ["a", "b3"], ["cat"], axis=1),
        onnx.helper.make_node("Reshape", ["cat", "split"], ["r"]),
        onnx.helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
        onnx.helper.make_node("Reshape", ["t", "merged"], ["shuffled" if chunked else "y"]),
    ]
    if chunked:
        nodes += [onnx.helper.make_node("Slice", ["shuffled", "zero", "half", "one"], ["first"]),
                  onnx.helper.make_node("Slice", ["shuffled", "half", "all", "one"], ["second"]),
                  onnx.helper.make_node("Sub", ["second", "first"], ["y"])]
    inits = [reference._const("w1", rng.standard_normal((channels, 8, 1, 1))),
             reference._const("w2", rng.standard_normal((half, half, 1, 1))),
             ints("zero", [0]), ints("half", [half]), ints("all", [channels]), ints("one", [1]),
             ints("split", [1, 2, half, 6, 6]), ints("merged", [1, channels, 6, 6])]
    return reference._model(nodes, [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 6, 6])],
                            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT,
                                                                [1, half if chunked else channels, 6, 6])],
                            inits)


def test_channel_split_unaligned_concat_and_shuffle_stay_blocked():
    model = _shufflenet_v2_unit()
    art = relaxc.compile(model, layout_block=16)
    report = art.report()["layout"]
    assert report["standard_op_kinds"] == {} and report["converters"] == 2  # the graph's input and output
    text = art.ir("layout")
    assert "take_channels" in text and "concat_channels" in text
    inputs = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(model, inputs))


def test_halves_of_a_shuffled_concat_gather_from_its_parts():
    """The next unit's halves read the concat's parts directly: neither the concat nor the shuffle
    is computed (each was a pass over the feature map)."""
    model = _shufflenet_v2_unit(chunked=True)
    art = relaxc.compile(model, layout_block=16)
    kernels = [gv.name_hint for gv in art.module("final").get_global_vars()]
    assert any(name.startswith("take_concat_channels") for name in kernels)  # one kernel, called for each half
    assert not any(name.startswith("concat_channels") for name in kernels)
    shuffles = [call for call in _calls(art.module("simplify"), "relax.take") if static_shape(call)[1] == 116]
    assert shuffles == []  # only the halves are taken (the unit's own split is a take of 58 channels too)
    inputs = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(model, inputs))


# --- the bundled ResNet-50 -------------------------------------------------------------------

@pytest.mark.slow
def test_resnet50_layout():
    art = relaxc.compile("onnx:resnet50")
    layout = art.module("layout")
    convs = _calls(layout, "relax.nn.conv2d")
    assert len(convs) == 53 and all(c.attrs.data_layout.endswith("c") for c in convs)
    assert all(isinstance(c.args[1], GenericConst) and c.args[1].value.numpy().ndim == 6 for c in convs)
    bound = _bindings(layout)
    stem_input = bound[convs[0].args[0]]
    assert stem_input.op.name == "relax.layout_transform"
    assert stem_input.args[0].same_as(layout["main"].params[0])
    assert [int(d) for d in stem_input.ty.shape.values] == [1, 1, 224, 224, 3]  # 3 channels, one block: unpadded
    assert _inverse_pairs(layout) == []
    report = art.report()["layout"]
    assert report["block"] in (8, 16)  # AVX2 or AVX-512 machine
    assert report["converters"] == 2  # into the stem, out before the classifier's reshape
    assert report["padded_tensors"] == []  # the stem's 3 channels are a block of their own


def _mixed_depthwise_unit(splits: list[int]) -> onnx.ModelProto:
    """MixNet's mixed depthwise convolution: a split along C into groups convolved with kernels of
    3, 5, 7... taps, concatenated, then batch norm (as the exporter leaves it) and swish."""
    rng, channels = np.random.default_rng(3), sum(splits)
    nodes = [onnx.helper.make_node("Conv", ["x", "w"], ["c"]),
             onnx.helper.make_node("Split", ["c", "splits"], [f"s{k}" for k in range(len(splits))], axis=1)]
    inits = [reference._const("w", rng.standard_normal((channels, 8, 1, 1))),
             onnx.numpy_helper.from_array(np.array(splits, np.int64), "splits")]
    for k, count in enumerate(splits):
        taps = 3 + 2 * k
        nodes.append(onnx.helper.make_node("Conv", [f"s{k}", f"d{k}"], [f"m{k}"], group=count,
                                           pads=[taps // 2] * 4))
        inits.append(reference._const(f"d{k}", rng.standard_normal((count, 1, taps, taps))))
    nodes += [onnx.helper.make_node("Concat", [f"m{k}" for k in range(len(splits))], ["cat"], axis=1),
              onnx.helper.make_node("BatchNormalization", ["cat", "gamma", "beta", "mean", "var"], ["bn"]),
              onnx.helper.make_node("Sigmoid", ["bn"], ["gate"]), onnx.helper.make_node("Mul", ["bn", "gate"], ["y"])]
    inits += [reference._const(name, rng.uniform(0.5, 1.5, channels)) for name in ("gamma", "beta", "mean", "var")]
    return reference._model(nodes, [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 14, 14])],
                            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, channels, 14, 14])],
                            inits)


@pytest.mark.parametrize("splits", [[16, 16, 32], [10, 10, 12]])  # whole blocks; parts across blocks
def test_a_split_along_channels_stays_blocked_and_its_concat_vectorises(splits):
    """Parts of whole blocks are slices of the blocked axis, others gathers; the concat (with its
    norm and swish) gets vector loops, not a loop scalarised by a per-lane guard, and a plain gather
    copies each output channel along the map, its channels in parallel (steps._lanes_from_tables)."""
    model = _mixed_depthwise_unit(splits)
    art = relaxc.compile(model, tuning="off")
    assert art.report()["layout"]["converters"] == 2  # the graph's input and output only
    gathers = {gv.name_hint: func for gv, func in art.module("final").functions.items()
               if isinstance(func, tvm.tirx.PrimFunc) and ("concat" in gv.name_hint or "take" in gv.name_hint)}
    assert gathers
    for name, func in gathers.items():
        _, blocks, _, _, lanes = (int(d) for d in func.params[-1].shape)
        script = func.script()
        if "T.vectorized" not in script and f"T.parallel(T.int64({blocks * lanes}))" in script:
            continue  # channel by channel
        llvm_ir = helpers.kernel_llvm_ir(func, art.target)
        assert re.search(r"<\d+ x float>", llvm_ir), name  # a loop scalarised by a per-lane guard has no vector at all
    inputs = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(model, inputs))
