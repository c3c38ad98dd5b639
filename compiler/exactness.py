"""Refusals that depend on shapes: nodes TVM's importer would convert into a kernel that computes a
different answer from ONNX's, on the shapes this compile binds. A wrong answer is worse than none,
so these are UnsupportedOperatorErrors before any compile work, naming node, op and attribute.

(Shape-independent refusals, by op type or attribute value, are in ``compiler/frontend.py``.)
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx
from onnx import numpy_helper

from compiler.runtime import TensorSpec
from support.errors import UnsupportedOperatorError


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _input_shapes(proto: onnx.ModelProto, inputs: list[TensorSpec]) -> dict[str, tuple[int, ...]]:
    """Static shapes of every tensor ONNX shape inference can tell, with the bound input shapes."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    bound = {name: shape for name, shape, _ in inputs}
    for value in copy.graph.input:
        if value.name in bound:
            for dim, size in zip(value.type.tensor_type.shape.dim, bound[value.name]):
                dim.Clear()
                dim.dim_value = size
    inferred = onnx.shape_inference.infer_shapes(copy)
    shapes = {}
    for value in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = tuple(d.dim_value for d in dims)
    return shapes


def _resize_with_fractional_scales(node: onnx.NodeProto, constants: dict[str, np.ndarray],
                                   shapes: dict[str, tuple[int, ...]]) -> str | None:
    """ONNX maps output coordinates back with the given ``scales``; TVM's resize with the rounded
    output size (``floor(in * scale)``): the two differ unless every ``in * scale`` is an integer."""
    if len(node.input) < 3 or not node.input[2] or node.input[2] not in constants:
        return None
    if len(node.input) > 3 and node.input[3]:
        return None  # sizes given: both sides use the sizes
    scales, shape = constants[node.input[2]], shapes.get(node.input[0])
    if shape is None or scales.size != len(shape):
        return None
    exact = np.asarray(shape, dtype=np.float64) * scales.astype(np.float64)
    if np.allclose(exact, np.round(exact), rtol=0, atol=1e-6):
        return None
    return (f"Resize node {node.name or node.output[0]!r}: scales {scales.tolist()} on input shape "
            f"{list(shape)} give fractional sizes {exact.tolist()}; TVM's resize maps coordinates with the "
            f"rounded sizes and would differ from ONNX. Give the node `sizes` instead of `scales` "
            f"(PyTorch: F.interpolate(size=...)), or an input shape the scales divide")


def _attr(node: onnx.NodeProto, name: str, default: str) -> str:
    value = next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)
    return value.decode() if isinstance(value, bytes) else value


def _source_coordinate(transform: str, x: int, size_in: int, size_out: int) -> Fraction | None:
    """ONNX's exact input coordinate of output index ``x`` (None: a mode not checked here)."""
    ratio = Fraction(size_in, size_out)
    if transform == "half_pixel" or (transform == "pytorch_half_pixel" and size_out > 1):
        return (x + Fraction(1, 2)) * ratio - Fraction(1, 2)
    if transform == "pytorch_half_pixel":
        return Fraction(0)
    if transform == "asymmetric":
        return x * ratio
    if transform == "tf_half_pixel_for_nn":
        return (x + Fraction(1, 2)) * ratio
    if transform == "align_corners":
        return x * Fraction(size_in - 1, size_out - 1)
    return None


def _resize_sizes(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> list[tuple[int, int, int]]:
    """(axis, input size, output size) of every resized axis whose shapes are known."""
    shape_in, shape_out = shapes.get(node.input[0]), shapes.get(node.output[0])
    if shape_in is None or shape_out is None:
        return []
    return [(axis, i, o) for axis, (i, o) in enumerate(zip(shape_in, shape_out)) if i != o]


def _resize_align_corners_to_one(node: onnx.NodeProto, _constants: dict, shapes: dict) -> str | None:
    """align_corners divides by ``out - 1``: TVM's constant folding fails on an output size of 1."""
    if _attr(node, "coordinate_transformation_mode", "half_pixel") != "align_corners":
        return None
    ones = [axis for axis, _, size_out in _resize_sizes(node, shapes) if size_out == 1]
    if not ones:
        return None
    return (f"Resize node {node.name or node.output[0]!r}: coordinate_transformation_mode=align_corners "
            f"with output size 1 on axis {ones[0]} (ONNX divides by size - 1 there); use half_pixel, or "
            f"ReduceMean/a slice for a 1-pixel output")


def _resize_nearest_ties(node: onnx.NodeProto, _constants: dict, shapes: dict) -> str | None:
    """Nearest rounds the source coordinate; where it is exactly on a rounding boundary and the size
    ratio is not a binary fraction, the float coordinate lands on either side of it depending on
    the order of operations, and TVM's pick differs from ONNX's (the fuzzer found 8 -> 15)."""
    if _attr(node, "mode", "nearest") != "nearest":
        return None
    transform = _attr(node, "coordinate_transformation_mode", "half_pixel")
    boundary = Fraction(1, 2) if _attr(node, "nearest_mode", "round_prefer_floor").startswith("round") else 0
    for axis, size_in, size_out in _resize_sizes(node, shapes):
        ratio = Fraction(size_in, size_out)
        if ratio.denominator & (ratio.denominator - 1) == 0:
            continue  # a binary fraction: float arithmetic is exact
        for x in range(size_out):
            source = _source_coordinate(transform, x, size_in, size_out)
            if source is not None and source > 0 and source - (source.numerator // source.denominator) == boundary:
                return (f"Resize node {node.name or node.output[0]!r}: mode=nearest, {transform}, resizing axis "
                        f"{axis} from {size_in} to {size_out} puts output {x} exactly on a rounding boundary "
                        f"(source coordinate {source}), where float arithmetic decides which pixel is taken "
                        f"and TVM's choice differs from ONNX's; use sizes with a ratio of 2^k, or mode=linear")
    return None


CHECKS = {"Resize": (_resize_with_fractional_scales, _resize_align_corners_to_one, _resize_nearest_ties)}


def refuse_inexact(proto: onnx.ModelProto, inputs: list[TensorSpec]) -> None:
    """Raise UnsupportedOperatorError listing every node of ``CHECKS`` that would compute wrongly."""
    nodes = [node for node in proto.graph.node if node.op_type in CHECKS]
    if not nodes:
        return
    constants, shapes = _constants(proto.graph), _input_shapes(proto, inputs)
    problems = [p for n in nodes for check in CHECKS[n.op_type] for p in [check(n, constants, shapes)] if p]
    if problems:
        raise UnsupportedOperatorError("; ".join(problems))
