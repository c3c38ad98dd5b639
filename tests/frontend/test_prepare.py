"""compiler/frontend/prepare.py: shape computations folded into constants before TVM's importer, checked
against onnxruntime; weights and dynamic computations are left alone."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import relaxc
from relaxc.frontend import prepare
from tests import reference


def _reshape_by_computed_shape(batch: int | str = 2) -> onnx.ModelProto:
    """What exporters write: the new shape computed from Shape/Gather/Unsqueeze/Concat, and a
    0-d ConstantOfShape (transformers' BERT export had one; the importer rejected it)."""
    i64 = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["new_shape"], axis=0),
        helper.make_node("Reshape", ["x", "new_shape"], ["flat"]),
        helper.make_node("ConstantOfShape", ["empty"], ["scalar"],
                         value=numpy_helper.from_array(np.array([2.0], np.float32))),
        helper.make_node("Mul", ["flat", "scalar"], ["out"]),
    ]
    inits = [i64("zero", 0), i64("axes", [0]), i64("minus_one", [-1]), i64("empty", np.zeros(0, np.int64))]
    return reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 4])],
                            [helper.make_tensor_value_info("out", TensorProto.FLOAT, [batch, 12])], inits)


def test_shape_computations_become_constants():
    model = _reshape_by_computed_shape()
    prepared = prepare.fold_shape_computations(model, {"x": (2, 3, 4)})
    ops = [n.op_type for n in prepared.graph.node]
    assert ops == ["Reshape", "Mul"]
    folded = {i.name: numpy_helper.to_array(i) for i in prepared.graph.initializer}
    assert folded["new_shape"].tolist() == [2, -1] and folded["scalar"].shape == () and folded["scalar"] == 2.0


def test_folded_model_compiles_and_matches_onnxruntime():
    model = _reshape_by_computed_shape()
    art = relaxc.compile(model, target="cpu", tuning="off")
    x = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))
    assert art.report()["ops"]["Shape"] == 1  # the report counts the user's model, not the folded one


def test_dynamic_dims_are_folded_as_bound():
    model = _reshape_by_computed_shape(batch="n")
    art = relaxc.compile(model, shapes={"x": (5, 3, 4)}, target="cpu", tuning="off")
    assert art.outputs[0][1] == (5, 12)
    x = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, x))


def test_weights_and_graph_outputs_are_not_folded():
    big = numpy_helper.from_array(np.ones((300, 300), np.float32), "w")
    nodes = [helper.make_node("Transpose", ["w"], ["wt"]), helper.make_node("MatMul", ["x", "wt"], ["y"]),
             helper.make_node("Shape", ["x"], ["out_shape"])]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 300])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 300]),
                              helper.make_tensor_value_info("out_shape", TensorProto.INT64, [2])], [big])
    prepared = prepare.fold_shape_computations(model, {"x": (1, 300)})
    assert [n.op_type for n in prepared.graph.node] == ["Transpose", "MatMul", "Shape"]


def test_shapes_a_round_made_static_fold_in_the_next():
    """A Reshape whose shape folds has a static output only after inference runs again: a Shape of
    that output (Swin-T's window partitions, block after block) folds in the next round."""
    i64 = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "two"], ["head"]),
             helper.make_node("Slice", ["s", "two", "four"], ["tail"]),
             helper.make_node("ReduceProd", ["tail"], ["area"], keepdims=1),  # inference cannot propagate it
             helper.make_node("Concat", ["head", "area"], ["shape1"], axis=0),
             helper.make_node("Reshape", ["x", "shape1"], ["y"]),  # (2, 3, 20): static once shape1 folds
             helper.make_node("Shape", ["y"], ["s2"]),
             helper.make_node("Reshape", ["y", "s2"], ["out"])]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])],
                             [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3, 20])],
                             [i64("zero", [0]), i64("two", [2]), i64("four", [4])])
    prepared = prepare.fold_shape_computations(model, {"x": (2, 3, 4, 5)})
    assert [n.op_type for n in prepared.graph.node] == ["Reshape", "Reshape"]
    folded = {i.name: numpy_helper.to_array(i).tolist() for i in prepared.graph.initializer}
    assert folded["s2"] == [2, 3, 20]


def test_constants_in_every_numeric_form_reach_the_importer_as_values():
    """Function bodies write Constant(value_float=...); the importer reads only ``value``."""
    nodes = [helper.make_node("Constant", [], ["half"], value_float=0.5),
             helper.make_node("Constant", [], ["shape"], value_ints=[3, 4]),
             helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Mul", ["r", "half"], ["y"])]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [12])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], [])
    art = relaxc.compile(model, target="cpu", tuning="off")
    x = np.arange(12, dtype=np.float32)
    np.testing.assert_array_equal(art.run(x)[0], (x * 0.5).reshape(3, 4))


def test_an_element_of_a_shape_whose_dim_is_static_folds_beside_dynamic_dims():
    """``chunk(2, dim=-1)`` of a tensor with a dynamic batch: its bounds come from the static last dim."""
    i64 = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "last"], ["width"]),
             helper.make_node("Div", ["width", "two"], ["half"]),
             helper.make_node("Unsqueeze", ["half", "axes"], ["end"]),
             helper.make_node("Slice", ["x", "zero", "end", "axes1"], ["out"])]
    model = reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
                             [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n", 3])],
                             [i64("last", -1), i64("two", 2), i64("axes", [0]), i64("zero", [0]), i64("axes1", [1])])
    prepared = prepare.fold_shape_computations(model, {"x": ("n", 6)})
    assert [n.op_type for n in prepared.graph.node] == ["Slice"]
    art = relaxc.compile(model, target="cpu", tuning="off", dim_bounds={"n": 8})
    x = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
    np.testing.assert_array_equal(art.run(x)[0], x[:, :3])
