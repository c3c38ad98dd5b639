"""Random valid ONNX graphs from the operators relaxc claims to support, and one it hands to an
external backend (NNSmith-style).

A graph grows from one NCHW input: each step picks an operator whose shape rules accept a tensor
already built, so every graph is valid by construction (``onnx.checker`` and shape inference
confirm it). Gathers take their indices from int64 graph inputs, whose valid extents (per
coordinate for GatherND) are in the input's doc string, so the checker can feed indices at run
time: valid ones, and out of range ones that must be refused as onnxruntime refuses them. Shapes are random, channel counts included, so blocks padded at the edge (channels that
do not divide 8 or 16) are common. Weights are fan-in scaled normals, so values stay in range
through a dozen layers and a wrong index shows as a wrong number.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
Shape = tuple[int, ...]


@dataclass
class Graph:
    """A graph under construction: tensors with their shapes, nodes, weights."""

    rng: np.random.Generator
    shapes: dict[str, Shape] = field(default_factory=dict)
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    indices: dict[str, tuple[Shape, list[int]]] = field(default_factory=dict)  # int64 inputs: shape, extents
    count: int = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def weight(self, shape: Shape, fan_in: int | None = None, positive: bool = False) -> str:
        scale = np.sqrt(2.0 / fan_in) if fan_in else 0.5
        value = self.rng.standard_normal(shape) * scale
        if positive:
            value = np.abs(value) + 0.5
        name = self.name("w")
        self.initializers.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def ints(self, values) -> str:
        name = self.name("c")
        self.initializers.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    def index_input(self, shape: Shape, extents: list[int]) -> str:
        """A new int64 graph input of ``shape`` indexing ``extents`` (one, or one per last-axis entry)."""
        name = self.name("i")
        self.indices[name] = (shape, extents)
        return name

    def floats(self, values) -> str:
        name = self.name("c")
        self.initializers.append(numpy_helper.from_array(np.asarray(values, dtype=np.float32), name))
        return name

    def add(self, op: str, inputs: list[str], shapes: list[Shape], **attrs) -> list[str]:
        """Append a node; output shapes come from ONNX's own shape inference, and must agree with
        ``shapes``, the generator's expectation (a disagreement is a generator bug, ValueError)."""
        outputs = [self.name("t") for _ in shapes]
        node = helper.make_node(op, inputs, outputs, name=f"{op.lower()}{len(self.nodes)}", **attrs)
        constants = {t.name: t for t in self.initializers}
        types = {name: helper.make_tensor_type_proto(TensorProto.FLOAT, self.shapes[name]) for name in inputs
                 if name in self.shapes}
        types.update({name: helper.make_tensor_type_proto(constants[name].data_type, constants[name].dims)
                      for name in inputs if name in constants})
        types.update({name: helper.make_tensor_type_proto(TensorProto.INT64, self.indices[name][0])
                      for name in inputs if name in self.indices})
        inferred = onnx.shape_inference.infer_node_outputs(
            onnx.defs.get_schema(op, OPSET), node, types, {n: constants[n] for n in inputs if n in constants},
            opset_imports=[helper.make_opsetid("", OPSET)])
        for out, shape in zip(outputs, shapes):
            dims = tuple(d.dim_value for d in inferred[out].tensor_type.shape.dim)
            if dims != tuple(shape):
                raise ValueError(f"{op} {attrs}: generator expected {tuple(shape)}, ONNX infers {dims}")
            self.shapes[out] = dims
        self.nodes.append(node)
        return outputs

    def pick(self, accept: Callable[[Shape], bool]) -> str | None:
        names = [n for n, s in self.shapes.items() if s and accept(s)]  # scalars (a Div's 1 + |c|) are not picked
        if not names:
            return None
        recent = names[-4:]  # prefer recent tensors: deeper graphs, fewer dead branches
        return recent[self.rng.integers(len(recent))] if self.rng.random() < 0.8 else \
            names[self.rng.integers(len(names))]


def _choice(rng: np.random.Generator, values):
    return values[rng.integers(len(values))]


def _operator(accept: Callable[[Shape], bool] = lambda shape: True) -> Callable:
    """A generator step applied to a tensor ``Graph.pick`` chooses among those ``accept`` takes;
    the step returns False when nothing fits."""
    def wrap(step: Callable[[Graph, str], bool]) -> Callable[[Graph], bool]:
        @functools.wraps(step)
        def run(g: Graph) -> bool:
            x = g.pick(accept)
            return x is not None and step(g, x)
        return run
    return wrap


def _rank4(shape: Shape) -> bool:
    return len(shape) == 4


def _pool_out(size: int, kernel: int, stride: int, pad: int, dilation: int = 1, ceil: bool = False) -> int:
    span = size + pad - dilation * (kernel - 1) - 1
    return (-(-span // stride) if ceil else span // stride) + 1


@_operator(lambda s: _rank4(s) and min(s[2:]) >= 3)
def conv(g: Graph, x: str) -> bool:
    n, c, h, w = g.shapes[x]
    rng = g.rng
    groups = 1
    if rng.random() < 0.3:
        groups = c if rng.random() < 0.6 else _choice(rng, [d for d in range(1, c + 1) if c % d == 0])
    out = groups * int(rng.integers(1, max(2, 48 // groups) + 1)) if groups > 1 else int(rng.integers(1, 49))
    if groups == c and rng.random() < 0.7:
        out = c  # depthwise
    kernel = int(_choice(rng, [1, 3, 3, 5]))
    dilation = int(_choice(rng, [1, 1, 1, 2]))
    stride = int(_choice(rng, [1, 1, 2]))
    pads = [int(rng.integers(0, kernel // 2 + 1)) for _ in range(4)]
    oh = _pool_out(h, kernel, stride, pads[0] + pads[2], dilation)
    ow = _pool_out(w, kernel, stride, pads[1] + pads[3], dilation)
    if oh < 1 or ow < 1:
        return False
    inputs = [x, g.weight((out, c // groups, kernel, kernel), c // groups * kernel * kernel)]
    if rng.random() < 0.7:
        inputs.append(g.weight((out,)))
    g.add("Conv", inputs, [(n, out, oh, ow)], kernel_shape=[kernel, kernel], strides=[stride, stride],
          pads=pads, dilations=[dilation, dilation], group=groups)
    return True


@_operator(_rank4)
def batch_norm(g: Graph, x: str) -> bool:
    c = g.shapes[x][1]
    g.add("BatchNormalization", [x, g.weight((c,), positive=True), g.weight((c,)), g.weight((c,)),
                                 g.weight((c,), positive=True)], [g.shapes[x]], epsilon=1e-5)
    return True


@_operator(lambda s: _rank4(s) and min(s[2:]) >= 2)
def pool(g: Graph, x: str) -> bool:
    n, c, h, w = g.shapes[x]
    rng = g.rng
    if rng.random() < 0.25:
        g.add(_choice(rng, ["GlobalAveragePool", "GlobalMaxPool"]), [x], [(n, c, 1, 1)])
        return True
    op = _choice(rng, ["MaxPool", "AveragePool"])
    kernel = int(_choice(rng, [2, 3]))
    stride = int(_choice(rng, [1, 2]))
    pads = [int(rng.integers(0, kernel // 2 + 1)) for _ in range(4)]
    ceil = bool(rng.random() < 0.3)
    attrs = {"kernel_shape": [kernel, kernel], "strides": [stride, stride], "pads": pads, "ceil_mode": int(ceil)}
    if op == "AveragePool":
        attrs["count_include_pad"] = int(rng.integers(0, 2))
    oh = _pool_out(h, kernel, stride, pads[0] + pads[2], ceil=ceil)
    ow = _pool_out(w, kernel, stride, pads[1] + pads[3], ceil=ceil)
    if oh < 1 or ow < 1:
        return False
    if ceil and ((oh - 1) * stride >= h + pads[0] or (ow - 1) * stride >= w + pads[1]):
        return False  # a last window starting in the end padding: onnx's shape inference and onnxruntime differ
    g.add(op, [x], [(n, c, oh, ow)], **attrs)
    return True


UNARY = {"Relu": {}, "Sigmoid": {}, "Tanh": {}, "Erf": {}, "Neg": {}, "Abs": {}, "Softplus": {},
         "LeakyRelu": {"alpha": 0.1}, "Elu": {"alpha": 1.0}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5},
         "HardSwish": {}, "Selu": {}}  # no Floor/Round: a last-bit difference upstream flips them


@_operator()
def unary(g: Graph, x: str) -> bool:
    op = _choice(g.rng, sorted(UNARY) + ["Clip", "Swish", "Gelu"])
    if op == "Clip":
        g.add("Clip", [x, g.floats(-1.0), g.floats(float(g.rng.uniform(0.5, 6.0)))], [g.shapes[x]])
    elif op == "Swish":  # x * sigmoid(x), as exporters write it
        (s,) = g.add("Sigmoid", [x], [g.shapes[x]])
        g.add("Mul", [x, s], [g.shapes[x]])
    elif op == "Gelu":  # the erf form, as exporters write it before opset 20
        (d,) = g.add("Div", [x, g.floats(np.sqrt(2.0))], [g.shapes[x]])
        (e,) = g.add("Erf", [d], [g.shapes[x]])
        (a,) = g.add("Add", [e, g.floats(1.0)], [g.shapes[x]])
        (m,) = g.add("Mul", [x, a], [g.shapes[x]])
        g.add("Mul", [m, g.floats(0.5)], [g.shapes[x]])
    else:
        g.add(op, [x], [g.shapes[x]], **UNARY[op])
    return True


def _partner(g: Graph, shape: Shape) -> tuple[str, Shape]:
    """A second operand and its shape: another tensor of the same shape, or a constant of a shape
    that broadcasts to ``shape``."""
    same = [n for n, s in g.shapes.items() if s == shape]
    rng = g.rng
    if len(same) > 1 and rng.random() < 0.5:
        return _choice(rng, same), shape
    forms = [shape, (), (shape[-1],)]
    if len(shape) == 4:
        forms += [(1, shape[1], 1, 1), (shape[1], 1, 1), (1, 1, shape[2], 1)]
    form = forms[rng.integers(len(forms))]
    return g.weight(form), form


@_operator()
def binary(g: Graph, x: str) -> bool:
    shape = g.shapes[x]
    op = _choice(g.rng, ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"])
    other, other_shape = _partner(g, shape)
    if op == "Div":  # keep the divisor away from zero
        (a,) = g.add("Abs", [other], [other_shape])
        (other,) = g.add("Add", [a, g.floats(1.0)], [other_shape])
    if op == "Pow":  # small integer exponents, as in GELU's tanh form and variance
        other = g.floats(float(_choice(g.rng, [2.0, 3.0])))
    g.add(op, [x, other] if g.rng.random() < 0.8 or op in ("Div", "Pow") else [other, x], [shape])
    return True


@_operator(lambda s: len(s) >= 2)
def concat(g: Graph, x: str) -> bool:
    shape = g.shapes[x]
    axis = 1 if len(shape) == 4 and g.rng.random() < 0.7 else int(g.rng.integers(len(shape)))
    key = lambda s: s[:axis] + s[axis + 1:]  # noqa: E731
    partners = [n for n, s in g.shapes.items() if len(s) == len(shape) and key(s) == key(shape)]
    others = [partners[g.rng.integers(len(partners))] for _ in range(int(g.rng.integers(1, 3)))]
    total = shape[axis] + sum(g.shapes[o][axis] for o in others)
    g.add("Concat", [x, *others], [shape[:axis] + (total,) + shape[axis + 1:]], axis=axis)
    return True


@_operator(lambda s: len(s) >= 2 and max(s[1:]) >= 2)
def split(g: Graph, x: str) -> bool:
    shape = g.shapes[x]
    axis = _choice(g.rng, [a for a in range(1, len(shape)) if shape[a] >= 2])
    cut = int(g.rng.integers(1, shape[axis]))
    sizes = [cut, shape[axis] - cut]
    outs = [shape[:axis] + (s,) + shape[axis + 1:] for s in sizes]
    g.add("Split", [x, g.ints(sizes)], outs, axis=int(axis))
    return True


@_operator(lambda s: len(s) >= 2)
def transpose(g: Graph, x: str) -> bool:
    shape = g.shapes[x]
    perm = [int(p) for p in g.rng.permutation(len(shape))]
    g.add("Transpose", [x], [tuple(shape[p] for p in perm)], perm=perm)
    return True


@_operator(lambda s: len(s) >= 2)
def reshape(g: Graph, x: str) -> bool:
    shape = g.shapes[x]
    rng = g.rng
    if rng.random() < 0.4:
        axis = int(rng.integers(1, len(shape)))
        g.add("Flatten", [x], [(int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))], axis=axis)
    elif len(shape) == 4 and shape[1] % 2 == 0 and rng.random() < 0.5:  # channel shuffle
        n, c, h, w = shape
        (a,) = g.add("Reshape", [x, g.ints([n, 2, c // 2, h, w])], [(n, 2, c // 2, h, w)])
        (b,) = g.add("Transpose", [a], [(n, c // 2, 2, h, w)], perm=[0, 2, 1, 3, 4])
        g.add("Reshape", [b, g.ints([n, -1, h, w])], [shape])
    else:  # merge the last two dims, written with 0 and -1 as exporters do
        target = shape[:-2] + (shape[-2] * shape[-1],)
        spec = [0] * (len(shape) - 2) + [-1]
        g.add("Reshape", [x, g.ints(spec)], [target])
    return True


@_operator(lambda s: 2 <= len(s) <= 4)
def matmul(g: Graph, x: str) -> bool:
    shape = g.shapes[x]
    k, n = shape[-1], int(g.rng.integers(1, 65))
    rng = g.rng
    if len(shape) == 2 and rng.random() < 0.5:
        trans_b = int(rng.integers(0, 2))
        w = g.weight((n, k) if trans_b else (k, n), k)
        g.add("Gemm", [x, w, g.weight((n,))], [(shape[0], n)], transB=trans_b, alpha=1.0, beta=1.0)
        return True
    same = [t for t, s in g.shapes.items() if s == shape and t != x]
    if len(shape) >= 3 and same and rng.random() < 0.4:  # attention-style: x @ y^T
        perm = list(range(len(shape) - 2)) + [len(shape) - 1, len(shape) - 2]
        (yt,) = g.add("Transpose", [same[-1]], [shape[:-2] + (shape[-1], shape[-2])], perm=perm)
        g.add("MatMul", [x, yt], [shape[:-1] + (shape[-2],)])
        return True
    g.add("MatMul", [x, g.weight((k, n), k)], [shape[:-1] + (n,)])
    return True


@_operator(lambda s: len(s) >= 2)
def normalize(g: Graph, x: str) -> bool:
    shape = g.shapes[x]
    if g.rng.random() < 0.5:
        g.add("Softmax", [x], [shape], axis=int(g.rng.integers(-len(shape), len(shape))))
    else:
        g.add("LayerNormalization", [x, g.weight((shape[-1],), positive=True), g.weight((shape[-1],))],
              [shape], axis=-1, epsilon=1e-5)
    return True


@_operator(lambda s: len(s) >= 2)
def reduce(g: Graph, x: str) -> bool:
    shape = g.shapes[x]
    op = _choice(g.rng, ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"])
    axes = sorted(int(a) for a in g.rng.choice(len(shape), int(g.rng.integers(1, len(shape))), replace=False))
    keep = int(g.rng.integers(0, 2))
    out = tuple(1 if a in axes else d for a, d in enumerate(shape)) if keep else \
        tuple(d for a, d in enumerate(shape) if a not in axes)
    if op == "ReduceSum":  # axes is an input from opset 13
        g.add(op, [x, g.ints(axes)], [out], keepdims=keep)
    else:
        g.add(op, [x], [out], axes=axes, keepdims=keep)
    return True


@_operator(lambda s: 1 <= len(s) <= 4)
def gather(g: Graph, x: str) -> bool:
    shape = g.shapes[x]
    rng = g.rng
    op = _choice(rng, ["Gather", "GatherElements", "GatherND"])
    axis = int(rng.integers(len(shape)))
    if op == "Gather":
        indices = tuple(int(d) for d in rng.integers(1, 5, size=int(rng.integers(1, 3))))
        out, extents = shape[:axis] + indices + shape[axis + 1:], [shape[axis]]
    elif op == "GatherElements":
        indices = shape[:axis] + (int(rng.integers(1, shape[axis] + 3)),) + shape[axis + 1:]
        out, extents = indices, [shape[axis]]
    else:
        k = int(rng.integers(1, min(2, len(shape)) + 1))
        indices = (int(rng.integers(1, 5)), k)
        out, extents = (indices[0],) + shape[k:], list(shape[:k])
    attrs = {} if op == "GatherND" else {"axis": axis}
    g.add(op, [x, g.index_input(indices, extents)], [out], **attrs)
    return True


@_operator()
def external(g: Graph, x: str) -> bool:
    """An operator TVM's importer does not convert (LpNormalization): relaxc hands it to an external
    backend as a subgraph between its own kernels, so partitions and their boundaries get fuzzed."""
    g.add("LpNormalization", [x], [g.shapes[x]], axis=int(g.rng.integers(-1, len(g.shapes[x]))),
          p=int(g.rng.integers(1, 3)))
    return True


RESIZE_MODES = ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel"]


@_operator(lambda s: _rank4(s) and max(s[2:]) <= 24)
def resize(g: Graph, x: str) -> bool:
    n, c, h, w = g.shapes[x]
    rng = g.rng
    mode = _choice(rng, ["nearest", "linear"])
    transform = _choice(rng, RESIZE_MODES if mode == "linear" else ["asymmetric", "half_pixel"])
    attrs = {"mode": mode, "coordinate_transformation_mode": transform}
    if mode == "nearest":
        attrs["nearest_mode"] = "floor" if transform == "asymmetric" else "round_prefer_floor"
    if rng.random() < 0.5:
        scale = float(_choice(rng, [2.0, 0.5]))
        oh, ow = int(np.floor(h * scale)), int(np.floor(w * scale))
        if oh < 1 or ow < 1:
            return False
        g.add("Resize", [x, "", g.floats([1, 1, scale, scale])], [(n, c, oh, ow)], **attrs)
    else:
        oh, ow = int(rng.integers(1, 2 * h + 1)), int(rng.integers(1, 2 * w + 1))
        g.add("Resize", [x, "", "", g.ints([n, c, oh, ow])], [(n, c, oh, ow)], **attrs)
    return True


@_operator(lambda s: len(s) >= 2)
def residual(g: Graph, x: str) -> bool:
    """``x`` plus an earlier tensor of its shape (a residual connection: a quantized add of two
    uint8 tensors); False where there is none."""
    same = [t for t, s in g.shapes.items() if s == g.shapes[x] and t != x]
    if not same:
        return False
    g.add("Add", [x, _choice(g.rng, same)], [g.shapes[x]])
    return True


OPERATORS: dict[str, Callable[[Graph], bool]] = {
    "conv": conv, "batch_norm": batch_norm, "pool": pool, "unary": unary, "binary": binary,
    "concat": concat, "split": split, "transpose": transpose, "reshape": reshape, "matmul": matmul,
    "normalize": normalize, "reduce": reduce, "resize": resize, "gather": gather, "external": external,
}
STEPS = {**OPERATORS, "residual": residual}  # residual: quantized graphs only (seeds keep their graphs)
QUANTIZABLE = ("conv", "pool", "unary", "binary", "residual", "concat", "matmul", "reshape", "transpose", "split")
WEIGHTS = {"residual": 2, "conv": 4, "batch_norm": 1, "pool": 2, "unary": 3, "binary": 3, "concat": 2, "split": 1,
           "transpose": 1, "reshape": 1, "matmul": 2, "normalize": 2, "reduce": 1, "resize": 1,
           "gather": 1, "external": 1}


def random_graph(seed: int, max_ops: int = 10, operators: tuple[str, ...] = tuple(OPERATORS)) -> onnx.ModelProto:
    """A valid random model (opset 17, one float32 NCHW input and the gathers' int64 index inputs,
    one or two outputs) of ``operators`` (``OPERATORS``' names)."""
    rng = np.random.default_rng(seed)
    g = Graph(rng)
    shape = (1, int(rng.integers(1, 41)), int(rng.integers(4, 33)), int(rng.integers(4, 33)))
    g.shapes["x"] = shape
    names = sorted(operators)
    p = np.array([WEIGHTS[n] for n in names], dtype=float)
    steps = int(rng.integers(2, max_ops + 1))
    done = 0
    while done < steps:
        done += STEPS[names[rng.choice(len(names), p=p / p.sum())]](g)
    consumed = {i for node in g.nodes for i in node.input}
    dangling = [o for node in g.nodes for o in node.output if o not in consumed]
    outputs = [g.nodes[-1].output[0]] + [o for o in dangling if o != g.nodes[-1].output[0]][:1]
    index_inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, index_shape,
                                                  doc_string=json.dumps({"extents": extents}))
                    for name, (index_shape, extents) in g.indices.items()]
    graph = helper.make_graph(
        g.nodes, f"fuzz{seed}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape), *index_inputs],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, g.shapes[o]) for o in outputs], g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="relaxc-fuzz")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def random_quantized_graph(seed: int, max_ops: int = 10, form: str = "QDQ",
                           activations: str = "uint8") -> onnx.ModelProto:
    """A random graph of ``QUANTIZABLE`` operators quantized as users quantize models with
    onnxruntime's tool (``benchmarks/quantized.quantize``: QDQ or QOperator ``form``, per-channel
    int8 weights, uint8 or int8 ``activations``, calibrated on random inputs): convolutions, matmuls, additions,
    concatenations and pooling between Q/DQ pairs (or as QLinear ops), the rest in float between them."""
    from relaxc.benchmarks.quantized import quantize

    model = quantize(random_graph(seed, max_ops, QUANTIZABLE), seed, form=form, activations=activations)
    model.producer_name = "relaxc-fuzz"
    return model
