"""passes/canonicalize/: importer idioms become the plain operators the layout pass understands."""

import numpy as np
import tvm
from onnx import TensorProto, helper, numpy_helper

from relaxc import frontend
from relaxc.passes.canonicalize.channels import ChannelShuffleToTake
from relaxc.passes.canonicalize.convolutions import DepthwisePointwiseToMultiply
from relaxc.passes.canonicalize.empty import EmptyConcatOperands
from relaxc.passes.canonicalize.elementwise import (ClipFromTIR, DivideByConstantToMultiply, DropoutToIdentity,
                                                    SumOfStackToAdd)
from relaxc.passes.canonicalize.matmuls import MatmulOfFlattenedRows
from relaxc.passes.canonicalize.reductions import WholeReductionsInSlabs
from tests.passes import relax_ops


def _imported(nodes, inputs, output_shape, initializers=()) -> tvm.IRModule:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return frontend.import_model(model).module


def _rewritten(pass_, mod: tvm.IRModule) -> tvm.IRModule:
    """The pass and the dead-code elimination the pipeline runs after it."""
    return tvm.relax.transform.DeadCodeElimination()(pass_(mod))


def test_sum_of_three_becomes_two_adds():
    shape = [1, 4, 3, 3]
    mod = _imported([helper.make_node("Sum", ["a", "b", "c"], ["y"])], [("a", shape), ("b", shape), ("c", shape)], shape)
    assert "relax.stack" in relax_ops(mod)
    ops = relax_ops(_rewritten(SumOfStackToAdd(), mod))
    assert "relax.stack" not in ops and "relax.sum" not in ops and ops.count("relax.add") == 2
    assert "relax.broadcast_to" not in ops  # no-op broadcasts dropped


def test_sum_that_broadcasts_keeps_the_broadcast():
    mod = _imported([helper.make_node("Sum", ["a", "b"], ["y"])], [("a", [1, 4, 3, 3]), ("b", [1, 4, 1, 1])],
                    [1, 4, 3, 3])
    ops = relax_ops(_rewritten(SumOfStackToAdd(), mod))
    assert "relax.stack" not in ops and ops.count("relax.add") == 1 and "relax.broadcast_to" in ops


def test_a_reduction_that_is_not_an_nary_add_stays():
    mod = _imported([helper.make_node("ReduceSum", ["a", "axes"], ["y"], keepdims=0)], [("a", [2, 3])], [3],
                    [numpy_helper.from_array(np.array([0], np.int64), "axes")])
    assert relax_ops(_rewritten(SumOfStackToAdd(), mod)) == relax_ops(mod)


def test_inference_dropout_is_its_input():
    mod = _imported([helper.make_node("Dropout", ["a"], ["y"])], [("a", [2, 3])], [2, 3])
    assert "relax.nn.dropout" in relax_ops(mod)
    assert "relax.nn.dropout" not in relax_ops(_rewritten(DropoutToIdentity(), mod))


def test_clip_call_tir_becomes_maximum_and_minimum():
    bounds = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lo", 0.0), ("hi", 6.0))]
    mod = _imported([helper.make_node("Clip", ["a", "lo", "hi"], ["y"])], [("a", [1, 4, 3, 3])], [1, 4, 3, 3], bounds)
    assert "relax.call_tir" in relax_ops(mod)
    ops = relax_ops(ClipFromTIR()(mod))
    assert "relax.call_tir" not in ops and "relax.maximum" in ops and "relax.minimum" in ops


def _divided_by(divisor: np.ndarray) -> tvm.IRModule:
    return _imported([helper.make_node("Div", ["x", "c"], ["y"])], [("x", [2, 3])], [2, 3],
                     [numpy_helper.from_array(divisor.astype(np.float32), "c")])


def test_division_by_a_constant_becomes_multiplication_by_its_reciprocal():
    divisor = np.array([6.0, 0.5, np.sqrt(2.0)])
    mod = DivideByConstantToMultiply()(_divided_by(divisor))
    assert relax_ops(mod) == ["relax.multiply"]
    x = np.random.default_rng(0).standard_normal((2, 3)).astype("float32") * 100
    got = tvm.relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    want = x / divisor.astype(np.float32)
    np.testing.assert_array_equal(got[:, 1], want[:, 1])  # a power of two: exact
    assert (np.abs(got - want) <= np.spacing(np.abs(want))).all()  # otherwise within an ulp


def test_division_by_zero_or_a_tiny_constant_stays_a_division():
    for divisor in ([1.0, 0.0, 2.0], [1.0, 1e38, 2.0], [1.0, np.inf, 2.0]):  # 1/1e38 is subnormal
        assert relax_ops(DivideByConstantToMultiply()(_divided_by(np.array(divisor)))) == ["relax.divide"]


def _depthwise(channels: int, groups: int, **attrs) -> tuple[tvm.IRModule, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((channels, channels // groups, 1, 1)).astype(np.float32)
    bias = rng.standard_normal(channels).astype(np.float32)
    out = [1, channels, 5 if attrs.get("strides") is None else 3, 5 if attrs.get("strides") is None else 3]
    mod = _imported([helper.make_node("Conv", ["x", "w", "b"], ["y"], group=groups, **attrs)], [("x", [1, channels, 5, 5])],
                    out, [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    return mod, weight, bias


def test_depthwise_1x1_convolution_becomes_a_per_channel_multiply():
    mod, weight, bias = _depthwise(6, 6)
    mod = _rewritten(DepthwisePointwiseToMultiply(), mod)
    assert "relax.nn.conv2d" not in relax_ops(mod) and "relax.multiply" in relax_ops(mod)
    x = np.random.default_rng(0).standard_normal((1, 6, 5, 5)).astype("float32")
    got = tvm.relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, x * weight.reshape(1, 6, 1, 1) + bias.reshape(1, 6, 1, 1), rtol=1e-6)


def test_other_1x1_convolutions_stay_convolutions():
    for groups, attrs in ((1, {}), (3, {}), (6, {"strides": [2, 2]})):
        mod, _, _ = _depthwise(6, groups, **attrs)
        assert "relax.nn.conv2d" in relax_ops(_rewritten(DepthwisePointwiseToMultiply(), mod)), (groups, attrs)


def _shuffle(split: list[int], perm: list[int]) -> tvm.IRModule:
    shape = [1, 12, 2, 2]
    ints = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
    return _imported([helper.make_node("Reshape", ["x", "split"], ["r"]),
                      helper.make_node("Transpose", ["r"], ["t"], perm=perm),
                      helper.make_node("Reshape", ["t", "back"], ["y"])],
                     [("x", shape)], shape, [ints("split", split), ints("back", shape)])


def test_channel_shuffle_becomes_a_take_of_the_permuted_channels():
    mod = _rewritten(ChannelShuffleToTake(), _shuffle([1, 3, 4, 2, 2], [0, 2, 1, 3, 4]))
    assert relax_ops(mod) == ["relax.take"]
    x = np.arange(48, dtype="float32").reshape(1, 12, 2, 2)
    expected = x.reshape(1, 3, 4, 2, 2).transpose(0, 2, 1, 3, 4).reshape(1, 12, 2, 2)
    lib = tvm.compile(mod, target="llvm")
    got = tvm.relax.VirtualMachine(lib, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(got, expected)


def test_halves_of_a_shuffle_gather_from_its_input_and_the_shuffle_goes():
    """ShuffleNetV2 chunks each shuffle's output in two: each half is a take of the input."""
    shape = [1, 12, 2, 2]
    ints = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Reshape", ["x", "split"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t", "back"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "six", "one"], ["a"]),
             helper.make_node("Slice", ["s", "six", "twelve", "one"], ["b"]),
             helper.make_node("Sub", ["b", "a"], ["y"])]  # both halves used, in an order the shuffle hides
    constants = [ints("split", [1, 2, 6, 2, 2]), ints("back", shape), ints("zero", [0]), ints("six", [6]),
                 ints("twelve", [12]), ints("one", [1])]
    mod = _rewritten(ChannelShuffleToTake(), _imported(nodes, [("x", shape)], [1, 6, 2, 2], constants))
    assert sorted(relax_ops(mod)) == ["relax.subtract", "relax.take", "relax.take"]
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    shuffled = x.reshape(1, 2, 6, 2, 2).transpose(0, 2, 1, 3, 4).reshape(shape)
    lib = tvm.compile(mod, target="llvm")
    got = tvm.relax.VirtualMachine(lib, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(got, shuffled[:, 6:] - shuffled[:, :6])


def test_other_reshape_transposes_are_left_alone():
    mod = _shuffle([1, 3, 4, 2, 2], [0, 1, 2, 4, 3])  # swaps the spatial axes: not a channel permutation
    assert "relax.take" not in relax_ops(_rewritten(ChannelShuffleToTake(), mod))


def test_a_whole_tensor_max_runs_in_slabs_of_vectors():
    """``DynamicQuantizeLinear``'s range: a max over every element as (slabs, rows, 16) reduced over
    the rows, then over what is left; a small tensor stays one reduction."""
    import relaxc
    from tests import reference

    shape = [1, 128, 256]
    mod = _imported([helper.make_node("ReduceMax", ["x"], ["y"], keepdims=0)], [("x", shape)], [])
    rewritten = _rewritten(WholeReductionsInSlabs(), mod)
    assert relax_ops(rewritten).count("relax.max") == 2 and "R.shape([64, 32, 16])" in rewritten.script()
    small = _imported([helper.make_node("ReduceMax", ["x"], ["y"], keepdims=0)], [("x", [4, 64])], [])
    assert relax_ops(_rewritten(WholeReductionsInSlabs(), small)).count("relax.max") == 1
    for op in ("ReduceMax", "ReduceMin", "ReduceSum"):
        graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], keepdims=1)], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 1])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        got = relaxc.compile(model, tuning="off").run(x)[0]
        np.testing.assert_allclose(got, reference.ort_session(model).run(None, {"x": x})[0], rtol=1e-5)


def _flattened_linear(static: bool = False) -> tuple[tvm.IRModule, np.ndarray, np.ndarray]:
    """x (b, s, 4, 8) flattened to (b s, 32), times W plus b, viewed back as (b, s, 12): a Linear as
    GPT-2's Conv1D exports it, after attention's heads."""
    from tvm import relax, tirx

    rng = np.random.default_rng(0)
    weight, bias = rng.standard_normal((32, 12)).astype(np.float32), rng.standard_normal(12).astype(np.float32)
    b, seq = (2, 3) if static else (tirx.Var("batch", "int64"), tirx.Var("sequence", "int64"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([b, seq, 4, 8], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            rows = bb.emit(relax.op.reshape(x, [b * seq, 32]))
            product = bb.emit(relax.op.add(bb.emit(relax.op.matmul(rows, relax.const(weight))), relax.const(bias)))
            out = bb.emit_output(relax.op.reshape(product, [b, seq, 12]))
        bb.emit_func_output(out)
    return bb.get(), weight, bias


def test_a_matmul_of_dynamic_rows_flattened_and_viewed_back_takes_the_rows_as_they_are():
    mod, weight, bias = _flattened_linear()
    rewritten = _rewritten(MatmulOfFlattenedRows(), mod)
    assert relax_ops(rewritten) == ["relax.reshape", "relax.matmul", "relax.add"]
    assert "batch * sequence" not in rewritten["main"].script()  # the reshape left is (b, s, 4, 8) to (b, s, 32)
    vm = tvm.relax.VirtualMachine(tvm.compile(rewritten, target="llvm"), tvm.cpu())
    for shape in ((1, 1, 4, 8), (3, 5, 4, 8)):
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(got, x.reshape(*shape[:2], 32) @ weight + bias, rtol=1e-5, atol=1e-5)


def test_a_static_flattened_matmul_is_left_alone():
    mod, _, _ = _flattened_linear(static=True)
    assert relax_ops(_rewritten(MatmulOfFlattenedRows(), mod)) == relax_ops(mod)


def test_a_concatenations_empty_operand_is_dropped():
    """A rotary embedding of the whole head concatenates an empty pass-through slice (Phi-3's exports)."""
    i64 = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Slice", ["x", "four", "end", "one"], ["rest"]),  # [2, 0]
             helper.make_node("Slice", ["x", "zero", "four", "one"], ["head"]),
             helper.make_node("Neg", ["head"], ["turned"]),
             helper.make_node("Concat", ["turned", "rest"], ["y"], axis=1)]
    mod = _imported(nodes, [("x", [2, 4])], [2, 4], [i64("zero", [0]), i64("four", [4]), i64("one", [1]),
                                                      i64("end", [2 ** 63 - 1])])
    assert "relax.concat" in relax_ops(mod)
    ops = relax_ops(_rewritten(EmptyConcatOperands(), mod))
    assert "relax.concat" not in ops and "relax.negative" in ops


def test_a_concatenation_of_operands_with_extent_keeps_them_all():
    mod = _imported([helper.make_node("Concat", ["a", "b"], ["y"], axis=1)], [("a", [2, 1]), ("b", [2, 3])], [2, 4])
    assert relax_ops(_rewritten(EmptyConcatOperands(), mod)).count("relax.concat") == 1
