"""Refusals of nodes that TVM's importer would convert into something computing a different answer
from ONNX's: an attribute or optional output it ignores, or a form that is wrong on the shapes this
compile binds. A wrong answer is worse than none, so these are UnsupportedOperatorErrors before
any compile work, naming node, op and attribute, every one at once. Each rule says what it guards
against; the ONNX node suite (docs/conformance.md) and the fuzzer (docs/fuzzing.md) found them.
"""

from __future__ import annotations

import functools
from fractions import Fraction
from typing import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from relaxc.frontend import prepare
from relaxc.support.tensors import TensorSpec
from relaxc.support.errors import UnsupportedOperatorError


class Facts:
    """What the rules may ask about the graph. Constant values are converted when asked for, and
    shapes and element types come from ONNX shape inference (with the bound input shapes) only
    when a rule first asks: most models have no node that needs them, and inference copies the
    whole model, weights included."""

    def __init__(self, proto: onnx.ModelProto, inputs: list[TensorSpec], nodes: list[onnx.NodeProto]) -> None:
        self._proto, self._inputs = proto, inputs
        self._tensors = {t.name: t for t in proto.graph.initializer}
        self._tensors.update({node.output[0]: node.attribute[0].t for node in proto.graph.node
                              if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value"})
        self.used = {name for node in nodes for name in node.input} | {value.name for value in proto.graph.output}

    def constant(self, name: str) -> np.ndarray | None:
        """The value of ``name`` if it is an initializer or a Constant's output."""
        tensor = self._tensors.get(name)
        return None if tensor is None else numpy_helper.to_array(tensor)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return self._inferred[0]

    @property
    def types(self) -> dict[str, int]:
        """Element types of tensors; values of other kinds (sequences, optionals) are not here."""
        return self._inferred[1]

    @property
    def non_tensors(self) -> set[str]:
        """Values that are sequences, maps or optionals."""
        return self._inferred[2]

    @functools.cached_property
    def _inferred(self) -> tuple[dict[str, tuple[int, ...]], dict[str, int], set[str]]:
        copy = onnx.ModelProto()
        copy.CopyFrom(self._proto)
        bound = {name: shape for name, shape, _ in self._inputs}
        weights = {t.name for t in copy.graph.initializer}
        if any(value.name in weights for value in copy.graph.input):  # IR v3: inputs, so not constants
            kept = [value for value in copy.graph.input if value.name not in weights]
            del copy.graph.input[:]
            copy.graph.input.extend(kept)
            copy.ir_version = max(copy.ir_version, 4)
        for value in copy.graph.input:
            if value.name in bound:
                prepare.set_shape(value, bound[value.name])
        inferred = onnx.shape_inference.infer_shapes(copy)
        shapes, types = {}, {t.name: t.data_type for t in self._proto.graph.initializer}
        others = set()
        for value in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
            if value.type.WhichOneof("value") not in (None, "tensor_type"):
                others.add(value.name)
                continue
            tensor = value.type.tensor_type
            types[value.name] = tensor.elem_type
            if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
                shapes[value.name] = tuple(d.dim_value for d in tensor.shape.dim)
        return shapes, types, others


def _resize_with_fractional_scales(node: onnx.NodeProto, facts: Facts) -> str | None:
    """ONNX maps output coordinates back with the given ``scales``; TVM's resize with the rounded
    output size (``floor(in * scale)``): the two differ unless every ``in * scale`` is an integer."""
    scales = facts.constant(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if scales is None:
        return None
    if len(node.input) > 3 and node.input[3]:
        return None  # sizes given: both sides use the sizes
    shape = facts.shapes.get(node.input[0])
    if shape is None or scales.size != len(shape):
        return None
    exact = np.asarray(shape, dtype=np.float64) * scales.astype(np.float64)
    if np.allclose(exact, np.round(exact), rtol=0, atol=1e-6):
        return None
    return (f"scales {scales.tolist()} on input shape "
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


def _resize_align_corners_to_one(node: onnx.NodeProto, facts: Facts) -> str | None:
    """align_corners divides by ``out - 1``: TVM's constant folding fails on a spatial output size of
    1, also on an axis the node leaves at size 1 (the fuzzer's Gather of one row, then Resize)."""
    if _attr(node, "coordinate_transformation_mode", "half_pixel") != "align_corners":
        return None
    shape_out = facts.shapes.get(node.output[0]) or ()
    ones = [axis for axis, size in enumerate(shape_out) if axis >= 2 and size == 1]  # resized or not: 0/0
    if not ones:
        return None
    return (f"coordinate_transformation_mode=align_corners "
            f"with output size 1 on axis {ones[0]} (ONNX divides by size - 1 there); use half_pixel, or "
            f"ReduceMean/a slice for a 1-pixel output")


def _resize_nearest_ties(node: onnx.NodeProto, facts: Facts) -> str | None:
    """Nearest rounds the source coordinate; where it is exactly on a rounding boundary and the size
    ratio is not a binary fraction, the float coordinate lands on either side of it depending on
    the order of operations, and TVM's pick differs from ONNX's (the fuzzer found 8 -> 15, and
    14 -> 4, where the scale 2/7 is inexact although 14/4 is not)."""
    if _attr(node, "mode", "nearest") != "nearest":
        return None
    transform = _attr(node, "coordinate_transformation_mode", "half_pixel")
    boundary = Fraction(1, 2) if _attr(node, "nearest_mode", "round_prefer_floor").startswith("round") else 0
    for axis, size_in, size_out in _resize_sizes(node, facts.shapes):
        ratio = Fraction(size_in, size_out)
        if all(n & (n - 1) == 0 for n in (ratio.numerator, ratio.denominator)):
            continue  # 2^k: exact whether computed as x * in / out or as x / (out / in) (onnxruntime)
        for x in range(size_out):
            source = _source_coordinate(transform, x, size_in, size_out)
            if source is not None and source > 0 and source - (source.numerator // source.denominator) == boundary:
                return (f"mode=nearest, {transform}, resizing axis "
                        f"{axis} from {size_in} to {size_out} puts output {x} exactly on a rounding boundary "
                        f"(source coordinate {source}), where float arithmetic decides which pixel is taken "
                        f"and TVM's choice differs from ONNX's; use sizes with a ratio of 2^k, or mode=linear")
    return None


def _resize_antialias(node: onnx.NodeProto, facts: Facts) -> str | None:
    """``antialias=1`` widens the filter when downsampling; the importer ignores it."""
    if not next((a.i for a in node.attribute if a.name == "antialias"), 0):
        return None
    shrunk = [axis for axis, size_in, size_out in _resize_sizes(node, facts.shapes) if size_out < size_in]
    return (f"antialias=1 while downsampling axis {shrunk[0]} is ignored by the importer"
            if shrunk else None)


def _optional_outputs(*indices: int, why: str) -> Callable[[onnx.NodeProto, Facts], str | None]:
    """Outputs the importer gets wrong, which matter only when something reads them."""
    def rule(node: onnx.NodeProto, facts: Facts) -> str | None:
        used = [i for i in indices if len(node.output) > i and node.output[i] in facts.used]
        return f"optional output(s) {used} {why}" if used else None
    return rule


def _attribute(name: str, wrong: Callable[[object], bool], why: str) -> Callable[[onnx.NodeProto, Facts], str | None]:
    def rule(node: onnx.NodeProto, _facts: Facts) -> str | None:
        value = next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)
        if value is None or not wrong(value.decode() if isinstance(value, bytes) else value):
            return None
        return f"{name}={value.decode() if isinstance(value, bytes) else value} {why}"
    return rule


def _dropout_training(node: onnx.NodeProto, facts: Facts) -> str | None:
    """Opset 12+ takes training_mode as an input; the importer always applies inference Dropout,
    which is right only when training is off or the ratio is 0."""
    if len(node.input) < 3 or not node.input[2]:
        return None
    training, ratio = facts.constant(node.input[2]), facts.constant(node.input[1])
    if (training is not None and not bool(np.asarray(training).item())) or \
            (ratio is not None and float(np.asarray(ratio).item()) == 0.0):
        return None
    return "training_mode input (true or computed): the importer always applies inference Dropout"


def _conv_transpose_output_shape(node: onnx.NodeProto, facts: Facts) -> str | None:
    """The importer ignores ``output_shape``: right only when it is the shape the attributes give."""
    attrs = prepare.attributes(node)
    wanted = attrs.get("output_shape")
    if wanted is None:
        return None
    shape = facts.shapes.get(node.input[0])
    if shape is not None and facts.shapes.get(node.input[1]) is not None:
        spatial = len(shape) - 2
        kernel = attrs.get("kernel_shape") or facts.shapes[node.input[1]][2:]
        strides, dilations = attrs.get("strides", [1] * spatial), attrs.get("dilations", [1] * spatial)
        pads, extra = attrs.get("pads", [0] * 2 * spatial), attrs.get("output_padding", [0] * spatial)
        given = [strides[i] * (shape[2 + i] - 1) + extra[i] + (kernel[i] - 1) * dilations[i] + 1
                 - pads[i] - pads[spatial + i] for i in range(spatial)]
        if list(wanted)[-spatial:] == given:
            return None
    return f"output_shape={list(wanted)} is ignored by the importer (it computes the shape from pads)"


def _float_mod(node: onnx.NodeProto, facts: Facts) -> str | None:
    """ONNX requires fmod=1 for floats; with fmod=0 the importer's floor-mod answers 0 where ONNX's
    reference gives NaN (a zero or infinite operand)."""
    if next((a.i for a in node.attribute if a.name == "fmod"), 0):
        return None
    if facts.types.get(node.input[0]) not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE,
                                              onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
        return None
    return "fmod=0 on floating-point inputs (ONNX requires fmod=1 for floats)"


# Element types TVM 0.27 stores or converts differently from ONNX: its float8 conversions neither
# saturate nor keep NaN as ONNX specifies, and the 2- and 4-bit types cannot cross its runtime's
# byte-sized tensor copies (the node suite's Cast cases: wrong values or errors).
INEXACT_TYPES = {getattr(onnx.TensorProto, name) for name in (
    "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0", "FLOAT4E2M1",
    "INT4", "UINT4", "INT2", "UINT2") if hasattr(onnx.TensorProto, name)}


def _type_name(elem_type: int) -> str:
    return onnx.TensorProto.DataType.Name(elem_type)


def _inexact_cast(node: onnx.NodeProto, facts: Facts) -> str | None:
    """A Cast or CastLike from or to a type of ``INEXACT_TYPES``."""
    target = (next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast"
              else facts.types.get(node.input[1]))
    for role, elem_type in (("from", facts.types.get(node.input[0])), ("to", target)):
        if elem_type in INEXACT_TYPES:
            return (f"cast {role} {_type_name(elem_type)}: TVM converts float8 and 2/4-bit types "
                    f"differently from ONNX (rounding, saturation, NaN)")
    return None


# op type -> rules; each returns why the node would compute wrongly, or None.
RULES: dict[str, tuple[Callable[[onnx.NodeProto, Facts], str | None], ...]] = {
    "BatchNormalization": (_attribute("training_mode", lambda v: v == 1, "(training statistics) is ignored "
                                      "by the importer"),),
    "NonMaxSuppression": (lambda node, facts: "its data-dependent output shape is made static (and wrong) by "
                          "the importer",),
    "LayerNormalization": (_optional_outputs(1, 2, why="(Mean, InvStdDev) come back as scalars from the "
                                                      "importer"),),
    "Dropout": (_optional_outputs(1, why="(mask) comes back as float32, not bool, from the importer"),
                _dropout_training),
    "ConvTranspose": (_conv_transpose_output_shape,),  # where compiler/frontend/rewrites.py could not make it pads
    "SpaceToDepth": (_attribute("mode", lambda v: v != "DCR", "is ignored by the importer (DCR order "
                                "is produced)"),),
    "RoiAlign": (_attribute("mode", lambda v: v == "max", "gives other values from the importer"),),
    "Mod": (_float_mod,),
    "Cast": (_inexact_cast,),
    "CastLike": (_inexact_cast,),
    "Resize": (_resize_with_fractional_scales, _resize_align_corners_to_one, _resize_nearest_ties,
               _resize_antialias),
}


KINDS = {"sequence_type": "a sequence", "optional_type": "an optional", "map_type": "a map",
         "sparse_tensor_type": "a sparse tensor"}


def _sequence_values(proto: onnx.ModelProto) -> list[str]:
    values = [("input", v) for v in proto.graph.input] + [("output", v) for v in proto.graph.output]
    return [f"graph {role} {value.name!r} is {KINDS.get(kind, kind)}: relaxc takes and returns tensors only"
            for role, value in values if (kind := value.type.WhichOneof("value")) not in (None, "tensor_type")]


def _inexact_values(proto: onnx.ModelProto) -> list[str]:
    values = [("input", v) for v in proto.graph.input] + [("output", v) for v in proto.graph.output]
    return [f"graph {role} {value.name!r} has element type {_type_name(value.type.tensor_type.elem_type)}, "
            f"which TVM stores or converts differently from ONNX"
            for role, value in values if value.type.tensor_type.elem_type in INEXACT_TYPES]


def graph_problems(proto: onnx.ModelProto) -> list[str]:
    """Why relaxc's program cannot take or return the graph's inputs and outputs as they are."""
    return _sequence_values(proto) + _inexact_values(proto)


def inexact_nodes(nodes: list[onnx.NodeProto], facts: Facts) -> dict[int, str]:
    """Why each node of ``nodes`` that would compute wrongly would (``RULES``), by its index."""
    return {index: f"{node.op_type} node {node.name or node.output[0]!r}: {why}"
            for index, node in enumerate(nodes) if node.op_type in RULES and node.domain in ("", "ai.onnx")
            for rule in RULES[node.op_type] for why in [rule(node, facts)] if why}


def refuse_inexact(proto: onnx.ModelProto, inputs: list[TensorSpec], nodes: list[onnx.NodeProto],
                   facts: Facts | None = None) -> None:
    """Raise UnsupportedOperatorError listing every node of ``nodes`` (the graph's and its
    subgraphs') that would compute wrongly (``RULES``), and every graph output relaxc cannot return."""
    problems = graph_problems(proto)
    if any(node.op_type in RULES for node in nodes):
        problems += list(inexact_nodes(nodes, facts or Facts(proto, inputs, nodes)).values())
    if problems:
        raise UnsupportedOperatorError("; ".join(problems))
