"""ONNX preparation before TVM's importer: shape computations folded into constants.

Exporters compute shapes at run time (``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``,
``ConstantOfShape`` of a computed shape, masks built from ``Range`` and ``Equal``), even when every
shape is static. TVM's importer follows some of these chains and trips on others (a 0-d
``ConstantOfShape`` broke transformers' BERT export). Here ONNX's own shape inference gives each
value its static shape, ``Shape`` of a statically shaped value becomes a constant (an element read from
the shape of a value with dynamic dims too, where that dim is static), and any node whose
inputs are all constants is evaluated by ONNX's reference evaluator, the independent implementation
of the ONNX semantics, so the importer sees constants instead of computations.

Constants written as ``value_float(s)``/``value_int(s)`` (function bodies use them; the importer reads
only ``value``) become initializers.

Only small results are folded (``MAX_FOLDED_ELEMENTS``): shape arithmetic and masks, never weights,
whose folding stays with the simplify phase (a model's large constants are not duplicated here).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

MAX_FOLDED_ELEMENTS = 1 << 16
_NEVER_FOLDED = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                 "Bernoulli", "If", "Loop", "Scan",
                 "DequantizeLinear"}  # int8 weights stay int8: passes/quantized/products.py reads them


Dims = tuple[int | None, ...]  # a shape with None for each dim that is not static


def static_shapes(model: onnx.ModelProto, inputs: dict[str, tuple[int | str, ...]]) -> dict[str, tuple[int, ...]]:
    """Every value's static shape that ONNX shape inference finds, the inputs bound to ``inputs``
    (a dynamic dim by its name)."""
    return {name: dims for name, dims in known_dims(model, inputs).items() if None not in dims}  # type: ignore[misc]


def known_dims(model: onnx.ModelProto, inputs: dict[str, tuple[int | str, ...]]) -> dict[str, Dims]:
    """Every value's shape of known rank that ONNX shape inference finds, None for each dim it
    cannot size statically."""
    return {name: dims for name, (dims, _) in _inferred(model, inputs).items() if dims is not None}


def _inferred(model: onnx.ModelProto, inputs: dict[str, tuple[int | str, ...]]) -> dict[str, tuple[Dims | None, int]]:
    """Every value's dims (None where its rank is unknown) and element type, by ONNX shape inference.

    Inference runs on the graph without its large initializers (declared as inputs of their shape
    instead): their values never decide a shape, and copying and serialising ViT's 344 MB of
    weights for it took 2.5 s."""
    graph = model.graph
    small = [init for init in graph.initializer if _small(init)]
    large = [onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
             for init in graph.initializer if not _small(init)]
    initializers = {init.name for init in graph.initializer}
    declared = [value for value in graph.input if value.name not in initializers]
    bound = onnx.helper.make_model(
        onnx.helper.make_graph(graph.node, graph.name, declared + large, graph.output, small),
        opset_imports=model.opset_import, ir_version=max(model.ir_version, 4), functions=model.functions)
    for value in bound.graph.input:
        if value.name in inputs:
            set_shape(value, inputs[value.name])
    try:
        inferred = onnx.shape_inference.infer_shapes(bound, data_prop=True)
    except (onnx.shape_inference.InferenceError, ValueError):
        return {}
    found = {init.name: (tuple(init.dims), init.data_type) for init in small}
    graph = inferred.graph
    for value in list(graph.value_info) + list(graph.input) + list(graph.output):
        tensor = value.type.tensor_type
        dims = tensor.shape.dim if tensor.HasField("shape") else None
        found[value.name] = (None if dims is None else tuple(d.dim_value if d.HasField("dim_value") else None
                                                             for d in dims), tensor.elem_type)
    return found


def set_shape(value: onnx.ValueInfoProto, shape: Sequence[int | str]) -> None:
    """Give ``value`` this shape: sizes, and dynamic dims by name."""
    dims = value.type.tensor_type.shape
    del dims.dim[:]
    for size in shape:
        if isinstance(size, str):
            dims.dim.add().dim_param = size
        else:
            dims.dim.add().dim_value = size


def element_types(model: onnx.ModelProto, inputs: dict[str, tuple[int | str, ...]]) -> dict[str, int]:
    """Every value's element type (``onnx.TensorProto`` codes) that ONNX shape inference finds."""
    return {name: elem for name, (_, elem) in _inferred(model, inputs).items() if elem}


def _small(init: onnx.TensorProto) -> bool:
    """An initializer whose value folding may use: small and in the file."""
    return int(np.prod(init.dims)) <= MAX_FOLDED_ELEMENTS and init.data_location != onnx.TensorProto.EXTERNAL


_SCALAR_CONSTANTS = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
                     "value_ints": np.int64}


def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    """A Constant's value, in any of its numeric forms (the importer reads only ``value``)."""
    if node.op_type != "Constant" or len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    if attr.name == "value":
        return numpy_helper.to_array(attr.t)
    if attr.name in _SCALAR_CONSTANTS:
        return np.array(onnx.helper.get_attribute_value(attr), dtype=_SCALAR_CONSTANTS[attr.name])
    return None


def _fold(node: onnx.NodeProto, constants: dict[str, np.ndarray], dims: dict[str, Dims],
          shape_of: dict[str, Dims], opset: int) -> list[np.ndarray] | None:
    """The node's outputs if it can be computed now, else None. ``shape_of`` has the dims of each
    ``Shape`` output: an element of it read by a constant index folds where that dim is static
    (``chunk`` halving a dynamic tensor's static last dim)."""
    if node.op_type == "Shape" and node.input[0] in dims:
        attrs = {a.name: a.i for a in node.attribute}
        shape = dims[node.input[0]]
        shape_of[node.output[0]] = shape = shape[attrs.get("start", 0):attrs.get("end", len(shape))]
        return None if None in shape else [np.array(shape, dtype=np.int64)]
    if node.op_type == "Gather" and node.input[0] in shape_of and node.input[1] in constants:
        picked = np.asarray(np.take(np.array(shape_of[node.input[0]], dtype=object), constants[node.input[1]]),
                            dtype=object)
        return None if None in picked.ravel() else [picked.astype(np.int64)]
    if node.op_type == "Size" and None not in dims.get(node.input[0], (None,)):
        return [np.array(int(np.prod(dims[node.input[0]])), dtype=np.int64)]
    if node.op_type in _NEVER_FOLDED or node.domain not in ("", "ai.onnx"):
        return None
    inputs = [name for name in node.input if name]
    if not inputs or not all(name in constants for name in inputs):
        return None
    try:
        evaluator = ReferenceEvaluator(node, opsets={"": opset})
        return list(evaluator.run(None, {name: constants[name] for name in inputs}))
    except Exception:  # noqa: BLE001 - the reference lacks some forms (GatherElements broadcasting): the importer computes them
        return None


MAX_ROUNDS = 64  # folding, then shape inference again: each round can make more shapes static


def fold_shape_computations(model: onnx.ModelProto, inputs: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """A copy of ``model`` with its small constant computations (shapes, masks) folded, its graph
    inputs having the static ``inputs`` shapes (dynamic dims bound by the caller). Rounds repeat
    while they fold something: a Reshape whose shape a round folded has a static output for the
    next round's inference (Swin-T's shifted windows take three)."""
    for _ in range(MAX_ROUNDS):
        folded = _fold_round(model, inputs)
        if folded is model:
            break
        model = folded
    return model


def _fold_round(model: onnx.ModelProto, inputs: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """One round of ``fold_shape_computations``: ``model`` itself if nothing folds."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    dims, shape_of = known_dims(model, inputs), {}
    constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer if _small(init)}
    outputs = {value.name for value in graph.output}
    folded: dict[str, np.ndarray] = {}
    kept = []
    for node in graph.node:
        value = _constant_value(node)
        if value is not None:
            constants[node.output[0]] = value
            if node.attribute[0].name == "value" or node.output[0] in outputs:
                kept.append(node)
            else:  # value_float(s), value_int(s): an initializer, which the importer reads
                folded[node.output[0]] = value
            continue
        results = _fold(node, constants, dims, shape_of, opset)
        if results is None or any(name in outputs for name in node.output) \
                or any(np.asarray(r).size > MAX_FOLDED_ELEMENTS for r in results):
            kept.append(node)
            continue
        for name, result in zip(node.output, results):
            constants[name] = folded[name] = np.asarray(result)
    if not folded:
        return model
    prepared = with_nodes(model, _live(kept, outputs))
    used = {name for node in prepared.graph.node for name in node.input} | outputs
    prepared.graph.initializer.extend(numpy_helper.from_array(v, name) for name, v in folded.items() if name in used)
    return prepared


def attributes(node: onnx.NodeProto) -> dict:
    """A node's attributes by name, as Python values."""
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def with_nodes(model: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    """A copy of ``model`` whose main graph has ``nodes`` instead of its own."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy


def _live(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` without those whose outputs nothing reads any more."""
    needed = set(outputs)
    live = []
    for node in reversed(nodes):
        if any(name in needed for name in node.output):
            live.append(node)
            needed.update(node.input)
            needed.update(subgraph_inputs(node))  # names a branch or loop body reads from outside
    return live[::-1]


def subgraph_inputs(node: onnx.NodeProto) -> set[str]:
    """The names the subgraphs of ``node`` (branches, loop bodies) read, at any depth."""
    names = set()
    for attr in node.attribute:
        for graph in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            for inner in graph.node:
                names.update(inner.input)
                names.update(subgraph_inputs(inner))
    return names


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph``, those of its branches and loop bodies too, at any depth."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(attr.g)
            for sub in attr.graphs:
                yield from all_nodes(sub)
