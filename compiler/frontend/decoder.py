"""Recognise a decoder "with past": one step of a causal language model as serving tools export it.

Its inputs are ``input_ids [batch, sequence]``, ``attention_mask [batch, past + sequence]``,
``position_ids [batch, sequence]`` and ``cache_position [sequence]`` where the model reads them, and each layer's
``past_key_values.{i}.key/.value [batch, kv_heads, past, head_dim]``; its outputs ``logits [batch,
sequence, vocab]`` and ``present.{i}.key/.value``, each its past with the step's keys or values
concatenated along the sequence axis (the optimum / transformers naming; ``kv_inputs`` /
``kv_outputs`` name other pairs). ``recognise`` checks all of that in the graph and refuses anything
else with a ``UserError`` naming what is missing, or what it takes that a session would not feed; the generation runtime reads what it found
(``Decoder.describe``, ``report()["decoder"]``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

import onnx

from relaxc.support.errors import UserError

PAST = re.compile(r"past_key_values\.(\d+)\.(key|value)$")  # optimum / transformers
IDS, MASK, POSITIONS, LOGITS = "input_ids", "attention_mask", "position_ids", "logits"
CACHE_POSITION = "cache_position"  # transformers': [sequence], each new token's row in the cache
FED = (IDS, MASK, POSITIONS, CACHE_POSITION)  # what a session feeds besides the pasts
SEQUENCE_AXIS = 2  # of a past or present: [batch, kv_heads, sequence, head_dim]


@dataclass(frozen=True)
class Decoder:
    """What generation needs of a recognised decoder: its input and output names, the dims its
    inputs share (by name), its cache's shape per pair, and the limits it is compiled for."""

    pairs: tuple[tuple[str, str], ...]  # (past input, present output) per layer and kind
    cache_shape: tuple[int, int]  # (kv_heads, head_dim) of every pair
    positions: bool  # whether the model reads position_ids
    dims: dict[str, str]  # batch, sequence, past, total: each one's name in the model
    vocab: int
    max_length: int
    max_batch: int
    all_logits: bool = False  # main keeps every position's logits, not the last position's alone
    cache_position: bool = False  # whether the model reads cache_position
    mask_positions: bool = False  # whether the graph counts positions over the mask itself (OPT)

    @property
    def padding(self) -> bool:
        """Whether rows of different lengths, left-padded, get transformers' positions: from
        ``position_ids`` (a session counts the real tokens) or from the mask in the graph."""
        return self.positions or self.mask_positions

    def bounds(self) -> dict[str, int]:
        """The dynamic dims' bounds: a step sees at most ``max_length`` tokens, ``max_length - 1``
        of them cached."""
        d = self.dims
        return {d["batch"]: self.max_batch, d["sequence"]: self.max_length, d["past"]: self.max_length - 1,
                d["total"]: self.max_length}

    def bounds_with(self, dim_bounds: Mapping[str, int] | None) -> dict[str, int]:
        """``bounds`` with the caller's ``dim_bounds`` for the model's other dims; a UserError where
        they bound one of the decoder's dims (``max_length`` and ``max_batch`` do)."""
        given = dict(dim_bounds or {})
        clash = sorted(set(given) & set(self.bounds()))
        if clash:
            raise UserError(f"dim_bounds bounds {', '.join(clash)}, which max_length and max_batch bound for a "
                            "decoder: leave them out")
        return {**self.bounds(), **given}

    def describe(self) -> dict:
        """``report()["decoder"]``: everything above, as JSON."""
        return {"pairs": [list(pair) for pair in self.pairs], "cache_shape": list(self.cache_shape),
                "positions": self.positions, "dims": dict(self.dims), "vocab": self.vocab,
                "max_length": self.max_length, "max_batch": self.max_batch, "all_logits": self.all_logits,
                "cache_position": self.cache_position, "padding": self.padding}


def recognise(proto: onnx.ModelProto, max_length: int, max_batch: int = 1, kv_inputs: Sequence[str] | None = None,
              kv_outputs: Sequence[str] | None = None, all_logits: bool = False) -> Decoder:
    """The decoder ``proto`` is, compiled for ``max_length`` tokens and ``max_batch`` sequences (every
    position's logits kept if ``all_logits``); a UserError naming what is missing where it is not a
    decoder with past."""
    for name, value in (("max_length", max_length), ("max_batch", max_batch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < (2 if name == "max_length" else 1):
            raise UserError(f"{name} must be a whole number of at least {2 if name == 'max_length' else 1}, "
                            f"not {value!r}")
    graph = proto.graph
    inputs = {v.name: v for v in graph.input if v.name not in {i.name for i in graph.initializer}}
    outputs = {v.name: v for v in graph.output}
    missing = [name for name in (IDS, MASK) if name not in inputs] + ([LOGITS] if LOGITS not in outputs else [])
    if missing:
        raise UserError(f"not a decoder with past: no {', '.join(missing)} (inputs {sorted(inputs)}, outputs "
                        f"{sorted(outputs)})")
    pairs = _pairs(inputs, outputs, kv_inputs, kv_outputs)
    unfed = sorted(set(inputs) - set(FED) - {past for past, _ in pairs})
    if unfed:
        merged = " (optimum's merged decoder: export with optimum-cli's --no-post-process and compile the " \
            "decoder with past it writes)" if "use_cache_branch" in unfed else ""
        raise UserError(f"the decoder takes {', '.join(unfed)}, which generation does not feed{merged}: a session "
                        f"feeds {', '.join(FED)} and the pasts; export the decoder without the others")
    dims = {"batch": _dim(inputs[IDS], 0), "sequence": _dim(inputs[IDS], 1), "total": _dim(inputs[MASK], 1)}
    shapes = set()
    for past, present in pairs:
        shape = [_dim(inputs[past], axis) for axis in range(4)] if _rank(inputs[past]) == 4 else None
        if shape is None or not isinstance(shape[SEQUENCE_AXIS], str) or shape[0] != dims["batch"]:
            raise UserError(f"past {past!r} is no [batch, kv_heads, past, head_dim] tensor with a dynamic past "
                            f"length (its dims: {shape or _rank(inputs[past])})")
        dims.setdefault("past", shape[SEQUENCE_AXIS])
        if shape[SEQUENCE_AXIS] != dims["past"]:
            raise UserError(f"past {past!r} has past length {shape[SEQUENCE_AXIS]!r}, the others {dims['past']!r}")
        shapes.add((shape[1], shape[3]))
        _check_extends(graph, past, present)
    unnamed = [key for key, name in dims.items() if not isinstance(name, str)]
    if unnamed:
        raise UserError(f"a decoder's {', '.join(unnamed)} dim must be dynamic and named, as exported for "
                        f"generation; it is {[dims[k] for k in unnamed]}")
    if len(shapes) != 1 or not all(isinstance(n, int) for n in next(iter(shapes))):
        raise UserError(f"every past must have the same fixed kv_heads and head_dim; they have {sorted(shapes)}")
    vocab = _dim(outputs[LOGITS], 2) if _rank(outputs[LOGITS]) == 3 else None
    if not isinstance(vocab, int):
        raise UserError(f"logits must be [batch, sequence, vocab] with a fixed vocab; it is {_dims(outputs[LOGITS])}")
    return Decoder(tuple(pairs), next(iter(shapes)), POSITIONS in inputs, dims, vocab, max_length, max_batch,
                   bool(all_logits), CACHE_POSITION in inputs, _reaches(graph, MASK, "CumSum"))


def with_position_ids(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """``proto`` reading ``position_ids [batch, sequence]`` where it looked positions up in a table by
    the cache's length (GPT-2 exported by TorchScript: ``wpe[arange(past, past + sequence)]``, the
    same for every row, so a left-padded row's real tokens got positions shifted by its padding);
    None where it does not do that. The lookup: a ``Gather`` from a constant table of indices
    ``Unsqueeze(Range(...) + ..., 0)`` ([1, sequence]) that neither the tokens nor the mask reach."""
    graph = proto.graph
    producers = {out: node for node in graph.node for out in node.output}
    constants = {i.name for i in graph.initializer}
    found = [i for i, node in enumerate(graph.node) if node.op_type == "Gather" and node.input[0] in constants
             and _range_row(node.input[1], producers)
             and not any(_depends(node.input[1], name, producers) for name in (IDS, MASK))]
    if not found:
        return None
    fed = onnx.ModelProto()
    fed.CopyFrom(proto)
    for i in found:
        fed.graph.node[i].input[1] = POSITIONS
    ids = next(v for v in fed.graph.input if v.name == IDS)
    fed.graph.input.append(onnx.helper.make_tensor_value_info(
        POSITIONS, onnx.TensorProto.INT64, [_dim(ids, 0), _dim(ids, 1)]))
    return fed


def _range_row(name: str, producers: dict[str, onnx.NodeProto]) -> bool:
    """Whether ``name`` is ``Unsqueeze(x, 0)`` of a 1-D ``x`` made from a ``Range`` by additions."""
    node = producers.get(name)
    if node is None or node.op_type != "Unsqueeze" or len(node.input) < 2:
        return False
    value = producers.get(node.input[0])
    while value is not None and value.op_type in ("Add", "Cast"):
        value = next((producers[i] for i in value.input if i in producers and _depends(i, None, producers, "Range")),
                     None)
    return value is not None and value.op_type == "Range"


def _depends(name: str, source: str | None, producers: dict[str, onnx.NodeProto], op: str | None = None) -> bool:
    """Whether ``name``'s values are computed from the graph input ``source`` (or by a node of type ``op``):
    through anything but a ``Shape``, which reads no values."""
    seen, stack = set(), [name]
    while stack:
        current = stack.pop()
        if current == source or (op is not None and current in producers and producers[current].op_type == op):
            return True
        if current in seen or current not in producers or producers[current].op_type == "Shape":
            continue
        seen.add(current)
        stack.extend(producers[current].input)
    return False


def _reaches(graph: onnx.GraphProto, source: str, op: str) -> bool:
    """Whether the graph input ``source`` feeds a node of type ``op``."""
    producers = {out: node for node in graph.node for out in node.output}
    return any(node.op_type == op and any(_depends(i, source, producers) for i in node.input) for node in graph.node)


def _pairs(inputs: dict, outputs: dict, kv_inputs: Sequence[str] | None,
           kv_outputs: Sequence[str] | None) -> list[tuple[str, str]]:
    """(past, present) pairs: the given names in order, else by the optimum naming."""
    if (kv_inputs is None) != (kv_outputs is None):
        raise UserError("kv_inputs and kv_outputs name the pairs together: give both, in the same order")
    if kv_inputs is None:
        found = sorted((int(m.group(1)), m.group(2), name) for name in inputs if (m := PAST.match(name)))
        kv_inputs = [name for _, _, name in found]
        kv_outputs = [f"present.{layer}.{kind}" for layer, kind, _ in found]
        if not kv_inputs:
            raise UserError(f"not a decoder with past: no input is named past_key_values.<layer>.key/value (inputs "
                            f"{sorted(inputs)}); name the cache's inputs and outputs with kv_inputs= and kv_outputs=")
    if len(kv_inputs) != len(kv_outputs):
        raise UserError(f"kv_inputs has {len(kv_inputs)} names, kv_outputs {len(kv_outputs)}: one present per past")
    absent = [n for n in kv_inputs if n not in inputs] + [n for n in kv_outputs if n not in outputs]
    if absent:
        raise UserError(f"the model has no {', '.join(repr(n) for n in absent)} (past inputs and present outputs "
                        "come in pairs)")
    return list(zip(kv_inputs, kv_outputs))


def _check_extends(graph: onnx.GraphProto, past: str, present: str) -> None:
    """That ``present`` is ``past`` with new rows concatenated along the sequence axis."""
    producers = {out: node for node in graph.node for out in node.output}
    node = producers.get(_source(present, producers))
    axis = next((a.i for a in node.attribute if a.name == "axis"), None) if node is not None else None
    first = _source(node.input[0], producers) if node is not None and node.input else None
    if node is None or node.op_type != "Concat" or axis not in (SEQUENCE_AXIS, SEQUENCE_AXIS - 4) or first != past:
        made = f"{node.op_type} {node.name!r}" if node is not None else "no node (a graph input or constant)"
        raise UserError(f"present {present!r} is not its past {past!r} extended along the sequence axis: it is made "
                        f"by {made}, not Concat({past}, new, axis={SEQUENCE_AXIS})")


def _source(name: str, producers: dict[str, onnx.NodeProto]) -> str:
    """The tensor ``name`` copies: through Identity nodes and Concats of one tensor (TorchScript
    exports write one per past)."""
    seen = {name}
    while name in producers and (producers[name].op_type == "Identity" or (
            producers[name].op_type == "Concat" and len(producers[name].input) == 1)):
        name = producers[name].input[0]
        if name in seen:
            break  # a cycle: no valid graph has one
        seen.add(name)
    return name


def _rank(value: onnx.ValueInfoProto) -> int:
    return len(value.type.tensor_type.shape.dim)


def _dim(value: onnx.ValueInfoProto, axis: int) -> int | str | None:
    """A dim's size, its name where dynamic, None where unknown."""
    dim = value.type.tensor_type.shape.dim[axis]
    return dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else (dim.dim_param or None)


def _dims(value: onnx.ValueInfoProto) -> list:
    return [_dim(value, axis) for axis in range(_rank(value))]
