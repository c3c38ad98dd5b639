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
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from relaxc.frontend import prepare

Shapes = Callable[[], dict[str, tuple[int, ...]]]  # static shapes, inferred on the first call


def rewrite(proto: onnx.ModelProto, inputs: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """A copy of ``proto`` with every rewritable node of its main graph rewritten (``proto``
    itself when there is none); ``inputs`` are the bound input shapes. Shape inference runs only
    when a rule first asks for shapes."""
    shapes = functools.cache(lambda: prepare.static_shapes(proto, inputs))
    nodes, changed = [], False
    for node in proto.graph.node:
        rule = _RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        replacement = rule(node, proto, shapes) if rule else None
        nodes.extend(replacement if replacement is not None else [node])
        changed |= replacement is not None
    return prepare.with_nodes(proto, nodes) if changed else proto


def _isinf(node: onnx.NodeProto, _proto: onnx.ModelProto, _shapes: Shapes) -> list[onnx.NodeProto] | None:
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
                                 shapes: Shapes) -> list[onnx.NodeProto] | None:
    attrs = prepare.attributes(node)
    wanted = attrs.get("output_shape")
    if wanted is None:
        return None
    initializers = {init.name: tuple(init.dims) for init in proto.graph.initializer}
    shape, weight = shapes().get(node.input[0]), shapes().get(node.input[1], initializers.get(node.input[1]))
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
                        shapes: Shapes) -> list[onnx.NodeProto] | None:
    attrs = prepare.attributes(node)
    if attrs.get("mode", b"DCR") not in (b"CRD", "CRD"):
        return None
    shape = shapes().get(node.input[0])
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


_RULES: dict[str, Callable[[onnx.NodeProto, onnx.ModelProto, Shapes], list[onnx.NodeProto] | None]] = {
    "IsInf": _isinf,
    "ConvTranspose": _conv_transpose_output_shape,
    "SpaceToDepth": _space_to_depth_crd,
}
