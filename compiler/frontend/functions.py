"""Operators that ONNX defines as functions of other operators, expanded into their bodies where
TVM's importer cannot convert them.

The bodies are ONNX's own (the ``onnx.defs`` schemas: the definitions the node suite's
``_expanded`` cases are built from), so an expansion computes what the operator is specified to,
with operators the importer converts: the standard ``Attention`` (opset 23), the losses, ``Swish``,
``RotaryEmbedding``..., and forms the importer gets wrong (``_converted_wrongly``). A
context-dependent body (one that depends on the input types, as Attention's does) is generated for
the node's inferred input types. ``Attention`` is expanded even
though the importer has a converter of that name: it implements onnxruntime's ``com.microsoft``
Attention, another operator (packed QKV weights, a ``num_heads`` attribute).
"""

from __future__ import annotations

import itertools

import onnx
from onnx import defs

from relaxc.frontend import prepare

IMPORTER_CONVERTS_ANOTHER_OPERATOR = {"Attention"}
_SOMETIMES_WRONG = {"LayerNormalization", "RMSNormalization"}  # see _converted_wrongly
_ONNX_DOMAINS = {"", "ai.onnx"}


def expand(proto: onnx.ModelProto, converted: set[str]) -> onnx.ModelProto:
    """A copy of ``proto`` (or ``proto`` itself, when nothing is expanded) with every top-level node
    of the ONNX domain that the importer does not convert (not in ``converted``), converts as
    another operator, or converts wrongly in its form, replaced by its function body, repeatedly (a
    body may use another function operator)."""
    opset = next((o.version for o in proto.opset_import if o.domain in _ONNX_DOMAINS), None)
    if opset is None:
        return proto
    names = itertools.count()
    for _ in range(4):  # bodies nest at most a few levels (SoftmaxCrossEntropyLoss -> NegativeLogLikelihoodLoss)
        used = {name for node in proto.graph.node for name in node.input} | {v.name for v in proto.graph.output}
        if not any(_wanted(node, converted, used, None) for node in proto.graph.node):
            return proto
        types = _value_types(proto)  # type inference only for a model with something to expand
        nodes, changed = [], False
        for node in proto.graph.node:
            schema = _schema(node, opset) if _wanted(node, converted, used, types) else None
            body = _body(node, schema, opset, types) if schema is not None else None
            if body is None:
                nodes.append(node)
                continue
            nodes.extend(_instantiate(node, body, _defaults(schema), f"{node.name or node.op_type}__{next(names)}__"))
            changed = True
        if not changed:
            return proto
        proto = prepare.with_nodes(proto, nodes)
    return proto


def _wanted(node: onnx.NodeProto, converted: set[str], used: set[str],
            types: dict[str, onnx.TypeProto] | None) -> bool:
    """Whether ``node`` is to be expanded (without ``types``: whether it may be)."""
    return node.domain in _ONNX_DOMAINS and (
        node.op_type not in converted or node.op_type in IMPORTER_CONVERTS_ANOTHER_OPERATOR
        or (node.op_type in _SOMETIMES_WRONG and _converted_wrongly(node, used, types)))


def _converted_wrongly(node: onnx.NodeProto, used: set[str], types: dict[str, onnx.TypeProto] | None) -> bool:
    """Forms the importer converts wrongly or not at all: LayerNormalization's Mean and InvStdDev
    outputs (scalars from the importer), RMSNormalization over every axis (a crash). Without
    ``types``: whether the node may be such a form (a negative axis may count every axis)."""
    if node.op_type == "LayerNormalization":
        return any(name in used for name in node.output[1:])
    if node.op_type == "RMSNormalization":
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        if types is None or axis >= 0:
            return axis <= 0
        value = types.get(node.input[0])
        return value is not None and axis == -len(value.tensor_type.shape.dim)
    return False


def _value_types(proto: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Every value's type that ONNX type inference finds (context-dependent bodies need them)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto).graph
    except (onnx.shape_inference.InferenceError, ValueError):
        inferred = proto.graph
    types = {value.name: value.type for value in
             list(inferred.input) + list(inferred.value_info) + list(inferred.output)}
    for init in proto.graph.initializer:
        types.setdefault(init.name, onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims)))
    return types


def _schema(node: onnx.NodeProto, opset: int) -> defs.OpSchema | None:
    try:
        return defs.get_schema(node.op_type, opset, node.domain)
    except defs.SchemaError:
        return None


def _body(node: onnx.NodeProto, schema: defs.OpSchema, opset: int,
          types: dict[str, onnx.TypeProto]) -> onnx.FunctionProto | None:
    """ONNX's function body of ``node`` for the model's opset, or None where it has none (or one
    relaxc does not instantiate: subgraph attributes, inputs of unknown type)."""
    plain = [v for v in schema.function_opset_versions if v <= opset]
    dependent = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    function = onnx.FunctionProto()
    if dependent and (not plain or max(dependent) >= max(plain)):
        inputs = [types.get(name) for name in node.input if name]
        if any(t is None for t in inputs):
            return None
        function.ParseFromString(schema.get_context_dependent_function_with_opset_version(
            max(dependent), node.SerializeToString(), [t.SerializeToString() for t in inputs]))
    elif plain:
        function.ParseFromString(schema.get_function_with_opset_version(max(plain)))
    else:
        return None
    if any(a.HasField("g") or a.graphs for inner in function.node for a in inner.attribute):
        return None
    return function


def _defaults(schema: defs.OpSchema) -> dict[str, onnx.AttributeProto]:
    """The schema's default attribute values."""
    return {name: attr.default_value for name, attr in schema.attributes.items() if attr.default_value.name}


def _instantiate(node: onnx.NodeProto, function: onnx.FunctionProto, defaults: dict[str, onnx.AttributeProto],
                 prefix: str) -> list[onnx.NodeProto]:
    """The body's nodes wired to ``node``'s inputs and outputs, internal values renamed under
    ``prefix``, attribute references resolved (the node's value, else the function's default, else
    the schema's)."""
    names = {formal: actual for formal, actual in zip(function.input, node.input)}
    names.update({formal: actual for formal, actual in zip(function.output, node.output) if actual})
    given = {**defaults, **{a.name: a for a in function.attribute_proto}, **{a.name: a for a in node.attribute}}
    rename = lambda name: names.get(name, prefix + name) if name else ""  # noqa: E731
    nodes = []
    for index, inner in enumerate(function.node):
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        copy.input[:] = [rename(n) for n in inner.input]
        copy.output[:] = [rename(n) for n in inner.output]
        copy.name = f"{prefix}{index}_{inner.name or inner.op_type}"  # unique: onnxruntime refuses repeated names
        del copy.attribute[:]
        for attribute in inner.attribute:
            if not attribute.ref_attr_name:
                copy.attribute.append(attribute)
            elif attribute.ref_attr_name in given:
                value = onnx.AttributeProto()
                value.CopyFrom(given[attribute.ref_attr_name])
                value.name = attribute.name
                copy.attribute.append(value)
        nodes.append(copy)
    return nodes
