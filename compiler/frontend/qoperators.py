"""Quantized operators in QOperator form written in QDQ form, which relaxc runs on the integers.

onnxruntime's quantizer writes a model either in QDQ form (``DequantizeLinear`` -> float op ->
``QuantizeLinear``) or in QOperator form, one node of ONNX's or onnxruntime's ``com.microsoft``
domain per quantized op (``QLinearConv``, ``QLinearMatMul``, ``QGemm``, ``QLinearAdd``...). TVM's
importer converts neither of the latter. Each is defined as the QDQ chain it replaces:

    QLinearConv(x, sx, zx, w, sw, zw, sy, zy, b) = Q(Conv(DQ(x, sx, zx), DQ(w, sw, zw), DQ(b, sx sw)), sy, zy)

(``sx sw`` the float32 product, per output channel, as the quantizer scales ``b``; QGemm's bias is
at ``alpha sa sb``), and onnxruntime fuses that chain back into the same kernel, so
``passes/quantized/`` turns it into the integer arithmetic onnxruntime's QOperator kernel does.
A node of these types in another form (scales that are not constants where a product is needed,
an output zero point left out, ``channels_last`` pooling, a pre-13 softmax over an inner axis) is
left as it is and refused by name.

``ConvInteger`` (``quantize_dynamic``'s convolution) is written the same way, with unit scales and
a cast of the sum to int32 (see ``_conv_integer``).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from relaxc.frontend import decompose, prepare

MICROSOFT = "com.microsoft"
PER_AXIS_OPSET = 13  # DequantizeLinear's axis; Softmax over one axis
Rule = Callable[[onnx.NodeProto, "_Emitter"], bool]


def to_qdq(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` with each QOperator node of its main graph written as its QDQ chain
    (``proto`` itself when there is none)."""
    if not any(_rule(node) for node in proto.graph.node):
        return proto
    graph = _Graph({init.name: init for init in proto.graph.initializer},
                   next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0),
                   collections.defaultdict(list), {value.name for value in proto.graph.output})
    for node in proto.graph.node:
        for name in node.input:
            graph.readers[name].append(node)
    nodes, changed = [], False
    for index, node in enumerate(proto.graph.node):
        rule = _rule(node)
        emit = _Emitter(f"{node.name or node.op_type}__qdq{index}", graph)
        try:
            done = rule(node, emit) if rule else False
        except _Unfit:
            done = False
        nodes.extend(emit.nodes if done else [node])
        changed |= done
    if not changed:
        return proto
    rewritten = prepare.with_nodes(proto, nodes)
    if not any(node.domain == MICROSOFT for node in nodes):
        del rewritten.opset_import[:]
        rewritten.opset_import.extend(o for o in proto.opset_import if o.domain != MICROSOFT)
    return rewritten


def _rule(node: onnx.NodeProto) -> Rule | None:
    if node.domain in ("", "ai.onnx"):
        return _ONNX_RULES.get(node.op_type)
    return _MICROSOFT_RULES.get(node.op_type) if node.domain == MICROSOFT else None


class _Unfit(Exception):
    """The node's form has no QDQ chain here."""


@dataclass
class _Graph:
    """What rules read of the model: its initializers, ONNX opset, each value's readers, outputs."""

    arrays: dict[str, onnx.TensorProto]
    opset: int
    readers: dict[str, list[onnx.NodeProto]]
    outputs: set[str]


class _Emitter(decompose.Emitter):
    """QDQ nodes with unique names under ``prefix`` for a node of ``graph``."""

    def __init__(self, prefix: str, graph: _Graph) -> None:
        super().__init__(prefix)
        self.graph = graph

    def array(self, name: str) -> np.ndarray | None:
        return numpy_helper.to_array(self.graph.arrays[name]) if name in self.graph.arrays else None

    def dequantize(self, x: str, scale: str, zero: str, axis: int | None = None) -> str:
        """``DequantizeLinear``; a per-axis one (``scale`` a vector) along ``axis``."""
        known = self.array(scale)
        vector = axis is not None and (known is None or known.ndim == 1)
        if vector and self.graph.opset < PER_AXIS_OPSET and (known is None or known.size > 1):
            raise _Unfit  # DequantizeLinear takes an axis from opset 13 on
        inputs = [x, scale, zero] if zero else [x, scale]
        return self.op("DequantizeLinear", inputs, **({"axis": axis} if vector else {}))

    def scale_product(self, *scales: str, factor: float = 1.0) -> str:
        """A constant: the float32 product of ``factor`` and these constant scales, as the
        quantizer computes a bias's scale."""
        product = np.float32(factor)
        for scale in scales:
            array = self.array(scale)
            if array is None:
                raise _Unfit  # a computed scale: the bias's is not known here
            product = (product * array.astype(np.float32)).astype(np.float32)
        return self.const(np.asarray(product, np.float32))


def _optional(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if len(node.input) > index else ""


def _qlinear_conv(node: onnx.NodeProto, emit: _Emitter) -> bool:
    x, sx, zx, w, sw, zw, sy, zy = (_optional(node, i) for i in range(8))
    if not zy:
        return False
    inputs = [emit.dequantize(x, sx, zx), emit.dequantize(w, sw, zw, axis=0)]
    if _optional(node, 8):
        inputs.append(emit.dequantize(node.input[8], emit.scale_product(sx, sw), "", axis=0))
    conv = emit.op("Conv", inputs, **prepare.attributes(node))
    emit.op("QuantizeLinear", [conv, sy, zy], node.output[0])
    return True


def _conv_integer(node: onnx.NodeProto, emit: _Emitter) -> bool:
    """``ConvInteger(x, w, zx, zw)``, the int32 sum of ``(x - zx)(w - zw)``, as ``Conv(DQ(x, 1, zx),
    DQ(w, 1, zw))`` cast to int32 where only casts to float32 read it (``quantize_dynamic``'s form):
    ``passes/quantized/products.py`` sums the integers exactly and rounds the sum to float32 once, which is
    what those casts make of onnxruntime's int32 sum, whatever its size."""
    x, w, zx, zw = (_optional(node, i) for i in range(4))
    readers = emit.graph.readers[node.output[0]]
    if node.output[0] in emit.graph.outputs or not readers or any(
            r.op_type != "Cast" or prepare.attributes(r).get("to") != onnx.TensorProto.FLOAT for r in readers):
        return False
    one = emit.const(np.array(1.0, np.float32))
    weight_zeros = emit.array(zw) if zw else None
    if weight_zeros is not None and weight_zeros.size > 1:  # per output channel: a scale each
        weights = emit.dequantize(w, emit.const(np.ones(weight_zeros.shape, np.float32)), zw, axis=0)
    elif zw and weight_zeros is None:
        return False  # a computed weight zero point: its shape is not known here
    else:
        weights = emit.dequantize(w, one, zw)
    conv = emit.op("Conv", [emit.dequantize(x, one, zx), weights], **prepare.attributes(node))
    emit.op("Cast", [conv], node.output[0], to=onnx.TensorProto.INT32)
    return True


def _qlinear_matmul(node: onnx.NodeProto, emit: _Emitter) -> bool:
    a, sa, za, b, sb, zb, sy, zy = node.input
    product = emit.op("MatMul", [emit.dequantize(a, sa, za, axis=-2), emit.dequantize(b, sb, zb, axis=-1)])
    emit.op("QuantizeLinear", [product, sy, zy], node.output[0])
    return True


def _qgemm(node: onnx.NodeProto, emit: _Emitter) -> bool:
    """onnxruntime's ``QGemm``: ``alpha A'B' + C``, ``C`` int32 at scale ``alpha sa sb``, then
    quantized when ``y_scale`` is given (float otherwise)."""
    a, sa, za, b, sb, zb, c, sy, zy = (_optional(node, i) for i in range(9))
    attrs = prepare.attributes(node)
    alpha = attrs.get("alpha", 1.0)
    if emit.graph.opset < PER_AXIS_OPSET and (alpha != 1.0 or c):
        raise _Unfit
    inputs = [emit.dequantize(a, sa, za), emit.dequantize(b, sb, zb, axis=0 if attrs.get("transB", 0) else 1)]
    if c:
        inputs.append(emit.dequantize(c, emit.scale_product(sa, sb, factor=alpha), "", axis=-1))
    gemm_attrs = {k: v for k, v in attrs.items() if k in ("alpha", "transA", "transB")}
    if not sy:
        emit.op("Gemm", inputs, node.output[0], **gemm_attrs)
        return True
    emit.op("QuantizeLinear", [emit.op("Gemm", inputs, **gemm_attrs), sy, zy], node.output[0])
    return True


def _binary(op_type: str) -> Rule:
    """``QLinearAdd`` / ``QLinearMul``: ``(A, sa, za, B, sb, zb, sc, zc)``."""

    def rule(node: onnx.NodeProto, emit: _Emitter) -> bool:
        a, sa, za, b, sb, zb, sc, zc = (_optional(node, i) for i in range(8))
        result = emit.op(op_type, [emit.dequantize(a, sa, za), emit.dequantize(b, sb, zb)])
        emit.op("QuantizeLinear", [result, sc, zc] if zc else [result, sc], node.output[0])
        return True

    return rule


def _unary(op_type: str, kept: dict[str, object] | None = None,
           refuse: Callable[[dict, int], bool] = lambda attrs, opset: False) -> Rule:
    """``QLinear<op>(X, sx, zx, sy, zy)`` with the attributes ``kept`` passed on (their value, or
    the default given where not None); ``refuse`` (of the attributes and the model's opset) the
    forms the float op would compute differently."""

    def rule(node: onnx.NodeProto, emit: _Emitter) -> bool:
        x, sx, zx, sy, zy = (_optional(node, i) for i in range(5))
        attrs = prepare.attributes(node)
        if refuse(attrs, emit.graph.opset):
            return False
        passed = {k: attrs.get(k, default) for k, default in (kept or {}).items()}
        result = emit.op(op_type, [emit.dequantize(x, sx, zx)], **{k: v for k, v in passed.items() if v is not None})
        emit.op("QuantizeLinear", [result, sy, zy] if zy else [result, sy], node.output[0])
        return True

    return rule


def _qlinear_concat(node: onnx.NodeProto, emit: _Emitter) -> bool:
    """``QLinearConcat(sy, zy, x1, s1, z1, x2, ...)``."""
    sy, zy, *triples = node.input
    parts = [emit.dequantize(*triples[i:i + 3]) for i in range(0, len(triples), 3)]
    joined = emit.op("Concat", parts, axis=prepare.attributes(node)["axis"])
    emit.op("QuantizeLinear", [joined, sy, zy], node.output[0])
    return True


_POOLING = dict.fromkeys(("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides"))


def _channels_last(attrs: dict, _opset: int) -> bool:
    return bool(attrs.get("channels_last", 0))


def _not_last_axis(attrs: dict, opset: int) -> bool:
    """Before opset 13 a softmax flattens the axes from ``axis`` on (the model's ``Softmax`` and
    the node's ``opset`` attribute): the same as today's only over the last axis, which is said."""
    return min(opset, attrs.get("opset", PER_AXIS_OPSET)) < PER_AXIS_OPSET and attrs.get("axis", -1) != -1


_ONNX_RULES: dict[str, Rule] = {"QLinearConv": _qlinear_conv, "QLinearMatMul": _qlinear_matmul,
                                 "ConvInteger": _conv_integer}
_MICROSOFT_RULES: dict[str, Rule] = {
    "QGemm": _qgemm,
    "QLinearAdd": _binary("Add"),
    "QLinearMul": _binary("Mul"),
    "QLinearConcat": _qlinear_concat,
    "QLinearSigmoid": _unary("Sigmoid"),
    "QLinearLeakyRelu": _unary("LeakyRelu", {"alpha": None}),
    "QLinearSoftmax": _unary("Softmax", {"axis": -1}, _not_last_axis),
    "QLinearGlobalAveragePool": _unary("GlobalAveragePool", refuse=_channels_last),
    "QLinearAveragePool": _unary("AveragePool", _POOLING, _channels_last),
}
OPERATORS = frozenset(_ONNX_RULES) | frozenset(_MICROSOFT_RULES)
