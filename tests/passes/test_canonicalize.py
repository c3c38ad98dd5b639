"""passes/canonicalize.py: importer idioms become the plain operators the layout pass understands."""

import numpy as np
import onnx
import tvm
from onnx import TensorProto, helper

from compiler import frontend
from passes.canonicalize import ClipFromTIR, DropoutToIdentity, SumOfStackToAdd


def _imported(nodes, inputs, output_shape, initializers=()) -> tvm.IRModule:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return frontend.import_model(model).module


def _rewritten(pass_, mod: tvm.IRModule) -> tvm.IRModule:
    """The pass and the dead-code elimination the pipeline runs after it."""
    return tvm.relax.transform.DeadCodeElimination()(pass_(mod))


def _ops(mod: tvm.IRModule) -> list[str]:
    found = []
    tvm.relax.analysis.post_order_visit(
        mod["main"], lambda e: found.append(e.op.name) if isinstance(e, tvm.relax.Call)
        and isinstance(e.op, tvm.ir.Op) else None)
    return found


def test_sum_of_three_becomes_two_adds():
    shape = [1, 4, 3, 3]
    mod = _imported([helper.make_node("Sum", ["a", "b", "c"], ["y"])], [("a", shape), ("b", shape), ("c", shape)], shape)
    assert "relax.stack" in _ops(mod)
    ops = _ops(_rewritten(SumOfStackToAdd(), mod))
    assert "relax.stack" not in ops and "relax.sum" not in ops and ops.count("relax.add") == 2
    assert "relax.broadcast_to" not in ops  # no-op broadcasts dropped


def test_sum_that_broadcasts_keeps_the_broadcast():
    mod = _imported([helper.make_node("Sum", ["a", "b"], ["y"])], [("a", [1, 4, 3, 3]), ("b", [1, 4, 1, 1])],
                    [1, 4, 3, 3])
    ops = _ops(_rewritten(SumOfStackToAdd(), mod))
    assert "relax.stack" not in ops and ops.count("relax.add") == 1 and "relax.broadcast_to" in ops


def test_a_reduction_that_is_not_an_nary_add_stays():
    mod = _imported([helper.make_node("ReduceSum", ["a", "axes"], ["y"], keepdims=0)], [("a", [2, 3])], [3],
                    [onnx.numpy_helper.from_array(np.array([0], np.int64), "axes")])
    assert _ops(_rewritten(SumOfStackToAdd(), mod)) == _ops(mod)


def test_inference_dropout_is_its_input():
    mod = _imported([helper.make_node("Dropout", ["a"], ["y"])], [("a", [2, 3])], [2, 3])
    assert "relax.nn.dropout" in _ops(mod)
    assert "relax.nn.dropout" not in _ops(_rewritten(DropoutToIdentity(), mod))


def test_clip_call_tir_becomes_maximum_and_minimum():
    bounds = [onnx.numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lo", 0.0), ("hi", 6.0))]
    mod = _imported([helper.make_node("Clip", ["a", "lo", "hi"], ["y"])], [("a", [1, 4, 3, 3])], [1, 4, 3, 3], bounds)
    assert "relax.call_tir" in _ops(mod)
    ops = _ops(ClipFromTIR()(mod))
    assert "relax.call_tir" not in ops and "relax.maximum" in ops and "relax.minimum" in ops
