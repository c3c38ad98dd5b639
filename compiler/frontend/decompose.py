"""Operators TVM's importer has no converter for, written as the standard ONNX nodes that compute
them, for static shapes.

- ``LSTM``, ``GRU`` and ``RNN`` (timm's Sequencer, speech and OCR models): the input projection of
  the whole sequence as one matmul per direction, then the recurrence unrolled over the time steps
  (each step a matmul of the hidden state and the gates' elementwise arithmetic, which fuse), in
  both directions where the layer is bidirectional. The weights must be initializers; the
  activations those without parameters (Sigmoid, Tanh, Relu, Softsign, Softplus); ``sequence_lens``
  absent or a constant equal to the sequence length everywhere; LSTM's ``input_forget`` off.
- ``Col2Im`` (torch's ``fold``: VOLO's outlook attention): the sum over the kernel's positions of
  each position's blocks, spread by the stride (a reshape and a pad), shifted to their offset (a
  pad) in the padded image, which is then cropped.

A node outside these forms is left as it is, and ``check_operators`` refuses it by name.
"""

from __future__ import annotations

import functools
import itertools
from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from relaxc.frontend import prepare

Shapes = Callable[[], dict[str, tuple[int, ...]]]
MIN_OPSET = 13  # Slice, Unsqueeze and Clip take their parameters as inputs
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
PLAIN_ACTIVATIONS = {"Sigmoid", "Tanh", "Relu", "Softsign", "Softplus"}  # ONNX ops of one input, no parameters


def decompose(proto: onnx.ModelProto, inputs: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """A copy of ``proto`` with each decomposable node of its main graph replaced (``proto`` itself
    when there is none); ``inputs`` are the bound input shapes."""
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET or not any(node.op_type in _RULES for node in proto.graph.node):
        return proto
    arrays = functools.cache(lambda: {init.name: init for init in proto.graph.initializer})
    shapes = functools.cache(lambda: {**{name: tuple(init.dims) for name, init in arrays().items()},  # inference
                                      **prepare.static_shapes(proto, inputs)})  # leaves out small initializers
    nodes, changed = [], False
    for index, node in enumerate(proto.graph.node):
        rule = _RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        emit = Emitter(f"{node.name or node.op_type}__{index}")
        done = rule(node, emit, shapes, lambda name: _array(arrays(), name)) if rule else False
        nodes.extend(emit.nodes if done else [node])
        changed |= bool(done)
    return prepare.with_nodes(proto, nodes) if changed else proto


def _array(initializers: dict[str, onnx.TensorProto], name: str) -> np.ndarray | None:
    return numpy_helper.to_array(initializers[name]) if name in initializers else None


class Emitter:
    """Nodes with unique names under ``prefix``, each with one output unless told otherwise."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self._names = itertools.count()

    def op(self, op_type: str, inputs: list[str], output: str | None = None, **attrs) -> str:
        output = output or f"{self.prefix}__{next(self._names)}"
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output

    def const(self, value: np.ndarray) -> str:
        return self.op("Constant", [], value=numpy_helper.from_array(np.asarray(value)))

    def ints(self, *values: int) -> str:
        return self.const(np.array(values, np.int64))

    def split(self, x: str, axis: int, sizes: list[int]) -> list[str]:
        outputs = [f"{self.prefix}__{next(self._names)}" for _ in sizes]
        self.nodes.append(helper.make_node("Split", [x, self.ints(*sizes)], outputs, name=outputs[0], axis=axis))
        return outputs

    def slice(self, x: str, axis: int, start: int, end: int) -> str:
        return self.op("Slice", [x, self.ints(start), self.ints(end), self.ints(axis)])

    def unsqueeze(self, x: str, axis: int) -> str:
        return self.op("Unsqueeze", [x, self.ints(axis)])

    def concat(self, parts: list[str], axis: int, output: str | None = None) -> str:
        return self.op("Concat", parts, output, axis=axis) if len(parts) > 1 else self.op("Identity", parts, output)


def _activations(node: onnx.NodeProto, attrs: dict, directions: int) -> list[str] | None:
    names = [a.decode() if isinstance(a, bytes) else a for a in attrs.get("activations", [])]
    names = names or DEFAULT_ACTIVATIONS[node.op_type] * directions
    return names if set(names) <= PLAIN_ACTIVATIONS and "activation_alpha" not in attrs else None


def _recurrent(node: onnx.NodeProto, emit: Emitter, shapes: Shapes, array: Callable) -> bool:
    """An LSTM, GRU or RNN unrolled (the module docstring says which forms); False to leave it."""
    attrs, kind = prepare.attributes(node), node.op_type
    args = list(node.input) + [""] * (8 - len(node.input))
    x_shape, r_shape = shapes().get(args[0]), shapes().get(args[2])
    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    reverse = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]
    activations = _activations(node, attrs, len(reverse))
    layout = attrs.get("layout", 0)
    if x_shape is None or len(x_shape) != 3 or r_shape is None or activations is None or attrs.get("input_forget", 0):
        return False
    seq, batch = (x_shape[1], x_shape[0]) if layout else (x_shape[0], x_shape[1])
    lengths = array(args[4]) if args[4] else None
    if args[4] and (lengths is None or (lengths != seq).any()):
        return False
    x = emit.op("Transpose", [args[0]], perm=[1, 0, 2]) if layout else args[0]
    step = {"LSTM": _lstm_step, "GRU": _gru_step, "RNN": _rnn_step}[kind]
    per_direction = len(activations) // len(reverse)
    ys, hs, cs = [], [], []
    for d, backwards in enumerate(reverse):
        cell = _Cell(emit, args, d, GATES[kind], r_shape[-1], activations[d * per_direction:(d + 1) * per_direction],
                     attrs.get("clip"), attrs.get("linear_before_reset", 0), kind == "LSTM")
        projected = emit.op("MatMul", [x, emit.op("Transpose", [cell.weights(args[1])], perm=[1, 0])])
        if cell.input_bias is not None:
            projected = emit.op("Add", [projected, cell.input_bias])
        state = [_initial(emit, args[5], d, batch, cell.hidden, x, layout)]
        if kind == "LSTM":
            state.append(_initial(emit, args[6], d, batch, cell.hidden, x, layout))
        steps, outputs = emit.split(projected, 0, [1] * seq) if seq > 1 else [projected], {}
        for t in (reversed(range(seq)) if backwards else range(seq)):  # states 1 x batch x hidden
            state = step(cell, steps[t], state)
            outputs[t] = state[0]
        ys.append(emit.unsqueeze(_concat_in_pairs(emit, [outputs[t] for t in range(seq)], 0), 1))
        hs.append(state[0])
        if kind == "LSTM":
            cs.append(state[1])
    names = list(node.output) + [""] * (3 - len(node.output))
    for index, (parts, perm) in enumerate(((ys, [2, 0, 1, 3]), (hs, [1, 0, 2]), (cs, [1, 0, 2]))):
        if names[index] and (index < 2 or kind == "LSTM"):
            joined = emit.concat(parts, 1 if index == 0 else 0, None if layout else names[index])
            if layout:
                emit.op("Transpose", [joined], names[index], perm=perm)
    return True


def _concat_in_pairs(emit: Emitter, parts: list[str], axis: int) -> str:
    """The concatenation of ``parts`` as a tree of two-input concats: TOPI's concatenate tests each
    input in turn for every element, and the steps' 32 outputs in one concat (fused with the last
    step's gates) ran at 2 % of its roofline bound (Sequencer2D's LSTMs: 15 ms of 190)."""
    while len(parts) > 1:
        parts = [emit.concat(parts[i:i + 2], axis) for i in range(0, len(parts), 2)]
    return parts[0]


def _initial(emit: Emitter, name: str, direction: int, batch: int, hidden: int, like: str, layout: int) -> str:
    """A direction's initial state, 1 x batch x hidden: its slice of the input ``name`` (directions
    first, or second with ``layout`` 1), or zeros of ``like``'s type."""
    if not name:
        return emit.op("CastLike", [emit.const(np.zeros((1, batch, hidden), np.float32)), like])
    return emit.slice(emit.op("Transpose", [name], perm=[1, 0, 2]) if layout else name, 0, direction, direction + 1)


class _Cell:
    """One direction's weights (gates stacked along the rows, as ONNX lays them out) and
    activations; the weights are sliced and transposed by nodes, which constant folding removes."""

    def __init__(self, emit: Emitter, args: list[str], direction: int, gates: int, hidden: int,
                 activations: list[str], clip: float | None, linear_before_reset: int, lstm: bool) -> None:
        self.emit, self.direction, self.hidden, self.activations, self.clip = emit, direction, hidden, activations, clip
        self.linear_before_reset = bool(linear_before_reset)
        self.r = self.weights(args[2])
        self._recurrent: dict[tuple[int, int], str] = {}
        self.input_bias = self.candidate_bias = None
        if args[3]:  # [input biases of every gate, recurrent biases of every gate]
            bias = self.weights(args[3])
            w_bias, r_bias = self.part(bias, 0, gates), self.part(bias, gates, gates)
            if self.linear_before_reset:  # GRU: the candidate's recurrent bias stays inside the reset gate's product
                self.candidate_bias = self.part(r_bias, 2)
                zeros = emit.op("CastLike", [emit.const(np.zeros(hidden, np.float32)), self.candidate_bias])
                r_bias = emit.op("Concat", [self.part(r_bias, 0, 2), zeros], axis=0)
            self.input_bias = emit.op("Add", [w_bias, r_bias])
        self.first_three = emit.const(np.arange(4 * hidden) < 3 * hidden) if lstm else None  # gates i, o, f
        self.peepholes = None
        if lstm and args[7]:
            p = self.weights(args[7])
            self.peepholes = [self.part(p, k) for k in range(3)]

    def weights(self, name: str) -> str:
        """This direction's slice of a weight input (the first axis is the direction)."""
        return self.emit.op("Gather", [name, self.emit.const(np.array(self.direction, np.int64))])

    def gate(self, x: str, activation: int) -> str:
        """The gate's pre-activation ``x`` clipped (``clip``) and activated."""
        if self.clip is not None:
            limit = self.emit.const(np.array(self.clip, np.float32))
            x = self.emit.op("Clip", [x, self.emit.op("CastLike", [self.emit.op("Neg", [limit]), x]),
                                      self.emit.op("CastLike", [limit, x])])
        return self.emit.op(self.activations[activation], [x])

    def part(self, x: str, index: int, count: int = 1) -> str:
        """Gates ``index`` to ``index + count`` of a weight's stacked gates."""
        return self.emit.slice(x, 0, index * self.hidden, (index + count) * self.hidden)

    def recurrent(self, h: str, first: int, count: int) -> str:
        """h times the recurrent weights of gates ``first`` to ``first + count``."""
        if (first, count) not in self._recurrent:
            rows = self.part(self.r, first, count)
            self._recurrent[first, count] = self.emit.op("Transpose", [rows], perm=[1, 0])
        return self.emit.op("MatMul", [h, self._recurrent[first, count]])


def _lstm_step(cell: _Cell, projected: str, state: list[str]) -> list[str]:
    """Gates i, o, f, c (ONNX's order); peepholes on i and f from C(t-1), on o from C(t). Without
    peepholes all four are activated at once, each column by its gate's function (both computed,
    one selected: an elementwise epilogue of the recurrent matmul), and sliced where they are read."""
    e, (h, c) = cell.emit, state
    gates = e.op("Add", [projected, cell.recurrent(h, 0, 4)])
    if cell.peepholes is None:
        activated = e.op("Where", [cell.first_three, cell.gate(gates, 0), cell.gate(gates, 1)])
        i, o, f, candidate = (e.slice(activated, 2, k * cell.hidden, (k + 1) * cell.hidden) for k in range(4))
        c = e.op("Add", [e.op("Mul", [f, c]), e.op("Mul", [i, candidate])])
        return [e.op("Mul", [o, e.op(cell.activations[2], [c])]), c]
    i, o, f, candidate = e.split(gates, 2, [cell.hidden] * 4)
    i = cell.gate(e.op("Add", [i, e.op("Mul", [cell.peepholes[0], c])]), 0)
    f = cell.gate(e.op("Add", [f, e.op("Mul", [cell.peepholes[2], c])]), 0)
    c = e.op("Add", [e.op("Mul", [f, c]), e.op("Mul", [i, cell.gate(candidate, 1)])])
    o = cell.gate(e.op("Add", [o, e.op("Mul", [cell.peepholes[1], c])]), 0)
    return [e.op("Mul", [o, e.op(cell.activations[2], [c])]), c]


def _gru_step(cell: _Cell, projected: str, state: list[str]) -> list[str]:
    """Gates z, r, h (ONNX's order); H(t) = h + z (H(t-1) - h)."""
    e, (h,), size = cell.emit, state, cell.hidden
    projected_zr, projected_h = e.split(projected, 2, [2 * size, size])
    if cell.linear_before_reset:
        recurrent_zr, recurrent_h = e.split(cell.recurrent(h, 0, 3), 2, [2 * size, size])
        update, reset = e.split(cell.gate(e.op("Add", [projected_zr, recurrent_zr]), 0), 2, [size, size])
        if cell.candidate_bias is not None:
            recurrent_h = e.op("Add", [recurrent_h, cell.candidate_bias])
        hidden_part = e.op("Mul", [reset, recurrent_h])
    else:
        update, reset = e.split(cell.gate(e.op("Add", [projected_zr, cell.recurrent(h, 0, 2)]), 0), 2, [size, size])
        hidden_part = cell.recurrent(e.op("Mul", [reset, h]), 2, 1)
    candidate = cell.gate(e.op("Add", [projected_h, hidden_part]), 1)
    return [e.op("Add", [candidate, e.op("Mul", [update, e.op("Sub", [h, candidate])])])]


def _rnn_step(cell: _Cell, projected: str, state: list[str]) -> list[str]:
    return [cell.gate(cell.emit.op("Add", [projected, cell.recurrent(state[0], 0, 1)]), 0)]


def _col2im(node: onnx.NodeProto, emit: Emitter, shapes: Shapes, array: Callable) -> bool:
    """The image as the sum over kernel positions of each position's blocks placed at their offset."""
    attrs = prepare.attributes(node)
    x_shape, image, block = shapes().get(node.input[0]), array(node.input[1]), array(node.input[2])
    if x_shape is None or image is None or block is None or len(image) != 2 or len(x_shape) != 3:
        return False
    (height, width), (kh, kw) = (int(v) for v in image), (int(v) for v in block)
    dh, dw = attrs.get("dilations", [1, 1])
    sh, sw = attrs.get("strides", [1, 1])
    top, left, bottom, right = attrs.get("pads", [0, 0, 0, 0])
    padded_h, padded_w = height + top + bottom, width + left + right
    rows, columns = (padded_h - dh * (kh - 1) - 1) // sh + 1, (padded_w - dw * (kw - 1) - 1) // sw + 1
    n, channels = x_shape[0], x_shape[1] // (kh * kw)
    if rows * columns != x_shape[2] or channels * kh * kw != x_shape[1]:
        return False
    by_position = emit.op("Reshape", [node.input[0], emit.ints(n, channels, kh * kw, rows, columns)])
    terms = []
    for ky, kx in itertools.product(range(kh), range(kw)):
        blocks = emit.op("Gather", [by_position, emit.const(np.array(ky * kw + kx, np.int64))], axis=2)
        if (sh, sw) != (1, 1):  # each block followed by stride - 1 zeros along both axes
            spread = emit.op("Reshape", [blocks, emit.ints(n, channels, rows, 1, columns, 1)])
            spread = emit.op("Pad", [spread, emit.ints(0, 0, 0, 0, 0, 0, 0, 0, 0, sh - 1, 0, sw - 1)])
            spread = emit.op("Reshape", [spread, emit.ints(n, channels, rows * sh, columns * sw)])
            blocks = emit.op("Slice", [spread, emit.ints(0, 0), emit.ints((rows - 1) * sh + 1, (columns - 1) * sw + 1),
                                       emit.ints(2, 3)])
        y, x = ky * dh, kx * dw
        ends = (padded_h - y - (rows - 1) * sh - 1, padded_w - x - (columns - 1) * sw - 1)
        terms.append(emit.op("Pad", [blocks, emit.ints(0, 0, y, x, 0, 0, *ends)]))
    total = emit.op("Sum", terms) if len(terms) > 1 else terms[0]
    emit.op("Slice", [total, emit.ints(top, left), emit.ints(top + height, left + width), emit.ints(2, 3)],
            node.output[0])
    return True


_RULES: dict[str, Callable[[onnx.NodeProto, Emitter, Shapes, Callable], bool]] = {
    "LSTM": _recurrent, "GRU": _recurrent, "RNN": _recurrent, "Col2Im": _col2im,
}
OPERATORS = frozenset(_RULES)  # what ``decompose`` may write out; a node it leaves is refused later
