"""Shrinking a failing graph to a minimal reproducer (delta debugging on the graph).

Two moves, each kept only if the graph still fails the same way: cut the graph after an earlier
tensor (that tensor becomes the only output, everything it does not depend on goes), and bypass a
node whose first input has its output's shape (its consumers read the input instead). Repeated
until neither move applies.
"""

from __future__ import annotations

from typing import Callable

import onnx
from onnx import helper

from tests.fuzz.check import Outcome


def _with_outputs(model: onnx.ModelProto, outputs: list[str], nodes: list[onnx.NodeProto]) -> onnx.ModelProto | None:
    """``model`` restricted to what ``outputs`` need; None when that is not a valid model."""
    needed, kept = set(outputs), []
    for node in reversed(nodes):
        if needed & set(node.output):
            kept.append(node)
            needed |= {i for i in node.input if i}
    kept.reverse()
    types = _types(model)
    if any(o not in types for o in outputs):  # not inferred (a com.microsoft QLinear operator's)
        return None
    graph = helper.make_graph(
        kept, model.graph.name, list(model.graph.input),
        [helper.make_tensor_value_info(o, *types[o]) for o in outputs],
        [t for t in model.graph.initializer if t.name in needed])
    smaller = helper.make_model(graph, opset_imports=list(model.opset_import), producer_name=model.producer_name)
    smaller.ir_version = model.ir_version
    try:
        onnx.checker.check_model(smaller, full_check=True)
    except Exception:  # noqa: BLE001 - an invalid candidate is just not taken
        return None
    return smaller


def _types(model: onnx.ModelProto) -> dict[str, tuple[int, list[int]]]:
    """Each tensor's inferred element type and shape."""
    inferred = onnx.shape_inference.infer_shapes(model)
    values = list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)
    return {v.name: (v.type.tensor_type.elem_type, [d.dim_value for d in v.type.tensor_type.shape.dim])
            for v in values}


def _cuts(model: onnx.ModelProto) -> list[onnx.ModelProto]:
    """The graph cut after each tensor, smallest first."""
    nodes = list(model.graph.node)
    candidates = []
    for node in nodes:
        for out in node.output:
            cut = _with_outputs(model, [out], nodes)
            if cut is not None and len(cut.graph.node) < len(nodes):
                candidates.append(cut)
    return sorted(candidates, key=lambda m: len(m.graph.node))


def _bypasses(model: onnx.ModelProto) -> list[onnx.ModelProto]:
    """The graph without one node whose first input has the type and shape of its output."""
    shapes = _types(model)
    outputs = [o.name for o in model.graph.output]
    candidates = []
    for index, node in enumerate(model.graph.node):
        source, out = node.input[0] if node.input else "", node.output[0]
        if not source or shapes.get(source) != shapes.get(out) or source not in shapes:
            continue
        rest = []
        for other in model.graph.node[:index] + model.graph.node[index + 1:]:
            copy = onnx.NodeProto()
            copy.CopyFrom(other)
            copy.input[:] = [source if i == out else i for i in copy.input]
            rest.append(copy)
        new_outputs = [source if o == out else o for o in outputs]
        if source in [i.name for i in model.graph.input] and new_outputs == [source]:
            continue
        smaller = _with_outputs(model, list(dict.fromkeys(new_outputs)), rest)
        if smaller is not None:
            candidates.append(smaller)
    return candidates


def shrink(model: onnx.ModelProto, failure: Outcome, check: Callable[[onnx.ModelProto], Outcome],
           budget: int = 200) -> onnx.ModelProto:
    """The smallest graph found (within ``budget`` checks) that fails like ``failure``."""
    checks = 0
    improved = True
    while improved and checks < budget:
        improved = False
        for candidate in _cuts(model) + _bypasses(model):
            checks += 1
            if failure.same_failure(check(candidate)):
                model, improved = candidate, True
                break
            if checks >= budget:
                break
    return model
