"""passes/fold_constants.py: calls on constants evaluated in numpy, exactly; others left alone."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import GenericConst

from relaxc.passes.fold_constants import FoldConstantsNumpy, FoldRemainingConstants, _computes_from_constants


def _module(body) -> tvm.IRModule:
    """main(x: (2, 3) float32) whose body ``body(x)`` builds."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(body(builder, x))
        builder.emit_func_output(out)
    return builder.get()


def _constants(mod: tvm.IRModule) -> list[np.ndarray]:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e.value.numpy())
                                    if isinstance(e, GenericConst) else None)
    return found


def test_arithmetic_on_constants_folds_to_the_numpy_value():
    a = np.arange(6, dtype="float32").reshape(2, 3)
    b = np.full((2, 3), 0.5, "float32")

    def body(bb, x):
        scaled = bb.emit(relax.op.multiply(relax.const(a), relax.const(b)))
        root = bb.emit(relax.op.sqrt(scaled))
        return relax.op.add(x, root)

    folded = relax.transform.DeadCodeElimination()(FoldConstantsNumpy()(_module(body)))
    (value,) = _constants(folded)  # one constant: the intermediate product is folded into it
    np.testing.assert_array_equal(value, np.sqrt(a * b))  # same IEEE operations: exact


def test_broadcast_of_a_scalar_fill_is_materialised():
    def body(bb, x):
        fill = bb.emit(relax.op.broadcast_to(relax.const(np.float32(2.0)), relax.ShapeExpr([2, 3])))
        return relax.op.multiply(x, fill)

    (value,) = _constants(FoldConstantsNumpy()(_module(body)))
    assert value.shape == (2, 3) and (value == 2.0).all()


def test_calls_on_inputs_and_unknown_operators_are_left_alone():
    def body(bb, x):
        unknown = bb.emit(relax.op.nn.relu(relax.const(np.ones((2, 3), "float32"))))
        return relax.op.add(x, unknown)

    mod = _module(body)
    assert tvm_ffi.structural_equal(FoldConstantsNumpy()(mod), mod)


def test_transposed_matrix_is_copied_by_tiles_exactly_and_casts_fold():
    a = np.random.default_rng(0).standard_normal((300, 520)).astype("float32")  # tiles past both edges

    def body(bb, x):
        weight = bb.emit(relax.op.permute_dims(relax.const(a), [1, 0]))
        ints = bb.emit(relax.op.astype(relax.const(np.array([1.7, -2.5], "float32")), "int32"))
        return relax.Tuple([weight, ints, x])

    weight, ints = _constants(FoldConstantsNumpy()(_module(body)))
    assert weight.shape == (520, 300) and weight.flags.c_contiguous
    np.testing.assert_array_equal(weight, a.T)
    np.testing.assert_array_equal(ints, np.array([1.7, -2.5], "float32").astype("int32"))


def _relu_of_a_constant(bb, x):
    unknown = bb.emit(relax.op.nn.relu(relax.const(np.full((2, 3), -1.0, "float32"))))  # not numpy's
    return relax.op.add(x, unknown)


def _divide_by_a_bound_constant(bb, x):
    divisor = bb.emit(relax.const(np.full((2, 3), 4.0, "float32")))
    return relax.op.divide(x, divisor)


def test_what_the_numpy_folder_leaves_tvm_folds():
    mod = _module(_relu_of_a_constant)
    assert _computes_from_constants(mod["main"])
    folded = FoldRemainingConstants()(mod)
    assert tvm_ffi.structural_equal(folded, relax.transform.FoldConstant()(mod))
    assert any((value == 0).all() for value in _constants(folded))  # relu(-1) computed


def test_with_nothing_to_fold_tvms_pass_is_skipped_and_constants_used_in_place_as_it_leaves_them(monkeypatch):
    mod = _module(_divide_by_a_bound_constant)
    assert not _computes_from_constants(mod["main"])
    expected = relax.transform.FoldConstant()(mod)
    monkeypatch.setattr(relax.transform, "FoldConstant", lambda: pytest.fail("TVM's FoldConstant ran"))
    result = FoldRemainingConstants()(mod)
    dead_code = relax.transform.DeadCodeElimination()  # the simplify phase's last pass; TVM's drops the binding
    assert tvm_ffi.structural_equal(dead_code(result), dead_code(expected))
    divide = result["main"].body.blocks[0].bindings[-1].value
    assert isinstance(divide.args[1], GenericConst)
