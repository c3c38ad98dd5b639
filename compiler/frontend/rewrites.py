"""ONNX-level rewrites of attributes TVM's importer ignores, into forms it converts.

Each rewrite replaces one node by standard ONNX nodes computing what the specification says:
- ``IsInf`` with ``detect_negative=0`` or ``detect_positive=0``: ``IsInf(x)`` and'ed with
  ``x > 0`` or ``x < 0``;
- ``ConvTranspose`` with ``output_shape``: the explicit ``pads`` the specification derives from it
  (``total = stride * (in - 1) + output_padding + (kernel - 1) * dilation + 1 - output_shape``, split
  as ``auto_pad`` says); a negative end padding becomes ``output_padding`` where that stays below
  the stride, as the specification requires of it;
- ``SpaceToDepth`` with ``mode=CRD`` (opset 28; the importer produces DCR order): the reshape,
  transpose, reshape that defines it.
A form not rewritten here is refused by ``compiler/frontend/exactness.py``.

And shape computations over dynamic dims into the forms whose values the importer follows as
expressions of the dims (a shape's element it reads as ``sequence``, an Add of it as
``sequence + 1``): where it met a ``Cast`` to the type a value already has, or a ``Reshape`` of a
scalar to one element, it made a run-time tensor of the value, and a ``Range`` of that one a fresh
size nothing bounds; a ``Slice`` from a dynamic start "to the end" (an end of ``INT64_MAX``) it sized
``INT64_MAX - start``. In a model with dynamic dims those become ``Identity`` and ``Unsqueeze``, the
end the dim read from the data's shape; an integer ``Range`` whose limit
or start is such a value (its step a constant) becomes ``start + step (CumSum(ones) - 1)``, the
ones a ``ConstantOfShape`` of the count ``(limit - start + step - 1) / step``, which the importer
sizes by the expression.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from relaxc.frontend import prepare

class Facts:
    """What the rules may ask of the graph, each inferred once, when a rule first asks: ``dims``
    (each value's shape of known rank, None for a dim that is not static), ``shapes`` (the static
    ones), ``types`` (element types)."""

    def __init__(self, proto: onnx.ModelProto, inputs: dict[str, tuple[int | str, ...]]) -> None:
        self.proto, self.inputs = proto, inputs

    @functools.cached_property
    def dims(self) -> dict[str, prepare.Dims]:
        return prepare.known_dims(self.proto, self.inputs)

    @functools.cached_property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: d for name, d in self.dims.items() if None not in d}  # type: ignore[misc]

    @functools.cached_property
    def types(self) -> dict[str, int]:
        return prepare.element_types(self.proto, self.inputs)


def rewrite(proto: onnx.ModelProto, inputs: dict[str, tuple[int | str, ...]]) -> onnx.ModelProto:
    """A copy of ``proto`` with every rewritable node of its main graph rewritten (``proto``
    itself when there is none); ``inputs`` are the bound input shapes. Shape inference runs only
    when a rule first asks for shapes."""
    facts = Facts(proto, inputs)
    dynamic = any(isinstance(d, str) for shape in inputs.values() for d in shape)
    rules = {**_RULES, **(_DYNAMIC_RULES if dynamic else {})}
    nodes, changed = [], False
    for node in proto.graph.node:
        rule = rules.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        replacement = rule(node, proto, facts) if rule else None
        nodes.extend(replacement if replacement is not None else [node])
        changed |= replacement is not None
    return prepare.with_nodes(proto, nodes) if changed else proto


def _isinf(node: onnx.NodeProto, _proto: onnx.ModelProto, _facts: Facts) -> list[onnx.NodeProto] | None:
    attrs = prepare.attributes(node)
    keep_negative, keep_positive = attrs.get("detect_negative", 1), attrs.get("detect_positive", 1)
    if keep_negative and keep_positive:
        return None
    x, out, name = node.input[0], node.output[0], node.name or node.output[0]
    zero = f"{name}__zero"
    nodes = [helper.make_node("Constant", [], [f"{name}__zero_f32"], name=f"{name}__const",
                              value=numpy_helper.from_array(np.array(0.0, np.float32))),
             helper.make_node("CastLike", [f"{name}__zero_f32", x], [zero], name=f"{name}__cast"),
             helper.make_node("IsInf", [x], [f"{name}__inf"], name=f"{name}__inf")]
    result = f"{name}__inf"
    for keep, op in ((keep_negative, "Greater"), (keep_positive, "Less")):
        if keep:
            continue
        sign, combined = f"{name}__{op.lower()}", f"{name}__and_{op.lower()}"
        nodes += [helper.make_node(op, [x, zero], [sign], name=sign),
                  helper.make_node("And", [result, sign], [combined], name=combined)]
        result = combined
    nodes.append(helper.make_node("Identity", [result], [out], name=name))
    return nodes


def _conv_transpose_output_shape(node: onnx.NodeProto, proto: onnx.ModelProto,
                                 facts: Facts) -> list[onnx.NodeProto] | None:
    attrs = prepare.attributes(node)
    wanted = attrs.get("output_shape")
    if wanted is None:
        return None
    initializers = {init.name: tuple(init.dims) for init in proto.graph.initializer}
    shape, weight = facts.shapes.get(node.input[0]), facts.shapes.get(node.input[1], initializers.get(node.input[1]))
    if shape is None or weight is None:
        return None
    spatial = len(shape) - 2
    wanted = list(wanted)[-spatial:]
    kernel = attrs.get("kernel_shape") or weight[2:]
    strides, dilations = attrs.get("strides", [1] * spatial), attrs.get("dilations", [1] * spatial)
    extra = attrs.get("output_padding", [0] * spatial)
    totals = [strides[i] * (shape[2 + i] - 1) + extra[i] + (kernel[i] - 1) * dilations[i] + 1 - wanted[i]
              for i in range(spatial)]
    upper = attrs.get("auto_pad", b"NOTSET") in (b"SAME_UPPER", "SAME_UPPER")
    begin = [t // 2 if upper else t - t // 2 for t in totals]
    end = [t - b for t, b in zip(totals, begin)]
    # a negative end padding is output beyond the last input's reach: output_padding, if it fits
    extra = [e - min(0, p) for e, p in zip(extra, end)]
    end = [max(0, p) for p in end]
    if any(b < 0 for b in begin) or any(e >= max(s, d) for e, s, d in zip(extra, strides, dilations)):
        return None
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    del copy.attribute[:]
    copy.attribute.extend(a for a in node.attribute if a.name not in ("output_shape", "auto_pad", "pads",
                                                                      "output_padding"))
    copy.attribute.append(helper.make_attribute("pads", begin + end))
    copy.attribute.append(helper.make_attribute("output_padding", extra))
    return [copy]


def _space_to_depth_crd(node: onnx.NodeProto, _proto: onnx.ModelProto,
                        facts: Facts) -> list[onnx.NodeProto] | None:
    attrs = prepare.attributes(node)
    if attrs.get("mode", b"DCR") not in (b"CRD", "CRD"):
        return None
    shape = facts.shapes.get(node.input[0])
    if shape is None or len(shape) != 4:
        return None
    n, c, h, w = shape
    b = attrs["blocksize"]
    name = node.name or node.output[0]
    const = lambda suffix, values: helper.make_node(  # noqa: E731
        "Constant", [], [f"{name}__{suffix}"], value=numpy_helper.from_array(np.array(values, np.int64)))
    return [const("split", [n, c, h // b, b, w // b, b]), const("merged", [n, c * b * b, h // b, w // b]),
            helper.make_node("Reshape", [node.input[0], f"{name}__split"], [f"{name}__blocks"]),
            helper.make_node("Transpose", [f"{name}__blocks"], [f"{name}__crd"], perm=[0, 1, 3, 5, 2, 4]),
            helper.make_node("Reshape", [f"{name}__crd", f"{name}__merged"], [node.output[0]], name=name)]


def _cast_to_own_type(node: onnx.NodeProto, _proto: onnx.ModelProto, facts: Facts) -> list[onnx.NodeProto] | None:
    if prepare.attributes(node).get("to") != facts.types.get(node.input[0]):
        return None
    return [helper.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name or node.output[0])]


def _scalar_to_one_element(node: onnx.NodeProto, _proto: onnx.ModelProto,
                           facts: Facts) -> list[onnx.NodeProto] | None:
    if facts.shapes.get(node.input[0]) != () or facts.shapes.get(node.output[0]) != (1,):
        return None
    name = node.name or node.output[0]
    return [helper.make_node("Constant", [], [f"{name}__axes"], value=numpy_helper.from_array(np.array([0], np.int64))),
            helper.make_node("Unsqueeze", [node.input[0], f"{name}__axes"], [node.output[0]], name=name)]


TO_THE_END = 2 ** 31 - 1  # a Slice end at least this large means "to the end" (exporters write INT64_MAX)


def _slice_to_the_end(node: onnx.NodeProto, proto: onnx.ModelProto, facts: Facts) -> list[onnx.NodeProto] | None:
    if len(node.input) < 3 or _constant(proto, node.input[1]) is not None:
        return None  # constant starts: the importer clamps a large end to the dim itself
    ends = _constant(proto, node.input[2])
    axes = _constant(proto, node.input[3]) if len(node.input) > 3 and node.input[3] else None
    steps = _constant(proto, node.input[4]) if len(node.input) > 4 and node.input[4] else None
    rank = len(facts.dims.get(node.input[0], ()))
    if ends is None or rank == 0 or (len(node.input) > 3 and node.input[3] and axes is None) \
            or (len(node.input) > 4 and node.input[4] and (steps is None or (steps != 1).any())) \
            or not (ends >= TO_THE_END).any():
        return None
    axes = np.arange(len(ends)) if axes is None else axes % rank
    name = node.name or node.output[0]
    const = lambda suffix, value: helper.make_node(  # noqa: E731
        "Constant", [], [f"{name}__{suffix}"], value=numpy_helper.from_array(np.array(value, np.int64)))
    made, parts = [const("axes0", [0]), helper.make_node("Shape", [node.input[0]], [f"{name}__shape_of"])], []
    for i, (end, axis) in enumerate(zip(ends.tolist(), axes.tolist())):
        if end < TO_THE_END:
            made.append(const(f"end{i}", [end]))
        else:  # as exporters read a dim (Gather of a scalar index, Unsqueeze): the importer follows it as the dim
            made += [const(f"axis{i}", axis),
                     helper.make_node("Gather", [f"{name}__shape_of", f"{name}__axis{i}"], [f"{name}__dim{i}"]),
                     helper.make_node("Unsqueeze", [f"{name}__dim{i}", f"{name}__axes0"], [f"{name}__end{i}"])]
        parts.append(f"{name}__end{i}")
    made.append(helper.make_node("Concat", parts, [f"{name}__ends"], axis=0))
    inputs = [node.input[0], node.input[1], f"{name}__ends", *node.input[3:]]
    return [*made, helper.make_node("Slice", inputs, [node.output[0]], name=name)]


def _constant(proto: onnx.ModelProto, name: str) -> np.ndarray | None:
    """The value of an initializer or ``Constant`` node output ``name``, if it is one."""
    for init in proto.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    node = next((n for n in proto.graph.node if name in n.output), None)
    return prepare._constant_value(node) if node is not None else None


def _range_of_dynamic_length(node: onnx.NodeProto, proto: onnx.ModelProto,
                             _facts: Facts) -> list[onnx.NodeProto] | None:
    start, limit, step = (_constant(proto, name) for name in node.input)
    if (limit is not None and start is not None) or step is None or step.dtype.kind != "i" or int(step) <= 0:
        return None
    name, out = node.name or node.output[0], node.output[0]
    emit = lambda op, inputs, suffix, **attrs: helper.make_node(  # noqa: E731
        op, inputs, [f"{name}__{suffix}"], name=f"{name}__{suffix}", **attrs)
    const = lambda suffix, value: helper.make_node(  # noqa: E731
        "Constant", [], [f"{name}__{suffix}"], value=numpy_helper.from_array(np.array(value, step.dtype)))
    first = [const("start", start)] if start is not None else [emit("Identity", [node.input[0]], "start")]
    return [*first, const("step", step), const("rounding", int(step) - 1),
            const("one", [1]),
            helper.make_node("Constant", [], [f"{name}__axes"], value=numpy_helper.from_array(np.array([0], np.int64))),
            emit("Sub", [node.input[1], f"{name}__start"], "span"),
            emit("Add", [f"{name}__span", f"{name}__rounding"], "rounded"),
            emit("Div", [f"{name}__rounded", f"{name}__step"], "count"),
            emit("Unsqueeze", [f"{name}__count", f"{name}__axes"], "shape"),
            emit("ConstantOfShape", [f"{name}__shape"], "ones", value=numpy_helper.from_array(np.array([1], step.dtype))),
            emit("CumSum", [f"{name}__ones", f"{name}__axes"], "counted"),
            emit("Sub", [f"{name}__counted", f"{name}__one"], "index"),
            emit("Mul", [f"{name}__index", f"{name}__step"], "scaled"),
            helper.make_node("Add", [f"{name}__scaled", f"{name}__start"], [out], name=name)]


Rule = Callable[[onnx.NodeProto, onnx.ModelProto, Facts], "list[onnx.NodeProto] | None"]
_RULES: dict[str, Rule] = {
    "IsInf": _isinf,
    "ConvTranspose": _conv_transpose_output_shape,
    "SpaceToDepth": _space_to_depth_crd,
}
_DYNAMIC_RULES: dict[str, Rule] = {  # with dynamic dims only
    "Cast": _cast_to_own_type,
    "Reshape": _scalar_to_one_element,
    "Range": _range_of_dynamic_length,
    "Slice": _slice_to_the_end,
}
