"""The partition of a model between relaxc's own kernels and external backends, on the ONNX graph.

Each node of the prepared graph (shapes folded, recurrent layers written out) is assigned
"relaxc" or an external backend's name; the nodes of one backend that touch each other form
subgraphs. A subgraph is made convex (no path leaves it and comes back: the relaxc nodes on such a
path join it), so it runs as one call. A subgraph whose outputs leave it with a shape that depends
on the data (NonMaxSuppression, NonZero...) cannot write into buffers planned in advance: it and
everything after it form the *tail*, run after relaxc's program on the values it returns. The
others are *calls* inside relaxc's program (``splice.py``). Values of other kinds than tensors
(sequences) never cross a boundary: their producer and readers go together.

Operators TVM cannot import never reach it: relaxc's part is a model of its own, whose graph
inputs include the outputs of the calls and whose graph outputs include their inputs.
"""

from __future__ import annotations

import collections
import fnmatch
import functools
from dataclasses import dataclass, field
from typing import Collection, Mapping, Protocol

import onnx

from relaxc.frontend import exactness, prepare
from relaxc.support.errors import UnsupportedOperatorError, UserError
from relaxc.support.subgraphs import ExternalSubgraph
from relaxc.support.tensors import TensorSpec

RELAXC = "relaxc"
# ops whose output shapes depend on input values: TVM has no static form of them
DATA_DEPENDENT = frozenset({"NonZero", "Unique", "NonMaxSuppression", "Compress", "StringSplit"})
RANDOM_PREFIXES = ("Random", "Bernoulli", "Multinomial")  # never computed ahead, never copied
# element types relaxc's program and the libraries' Python bindings cannot pass each other
UNBOUND_TYPES = frozenset({"bfloat16"})
# ops that make or read sequences and optionals (shape inference, which finds those values, copies
# the whole model: it runs only where one of these is present)
SEQUENCE_PREFIXES = ("Sequence", "SplitToSequence", "ConcatFromSequence", "Optional", "Loop", "Scan", "If")


@dataclass
class Subgraph(ExternalSubgraph):
    """Nodes one external backend runs (indices into the prepared graph), their op types, and
    why relaxc does not run them itself."""

    nodes: list[int] = field(default_factory=list)
    ops: dict[str, int] = field(default_factory=dict)
    why: str = ""


@dataclass
class Plan:
    """relaxc's part as a model of its own, the external subgraphs, and what relaxc's program
    returns (the model's outputs the tail does not make, then the tail's inputs)."""

    relaxc: onnx.ModelProto
    relaxc_inputs: list[TensorSpec]  # the model's inputs, then the outputs of the calls relaxc reads
    program_outputs: list[str]
    subgraphs: list[Subgraph]


def refused_nodes(proto: onnx.ModelProto, facts: exactness.Facts, converted: set[str]) -> dict[int, str]:
    """Why relaxc cannot run each node it cannot, by index in the graph: an operator TVM's importer
    does not convert (at any depth of its branches), a form it would convert wrongly, an output
    shape that depends on the data, a value that is not a tensor."""
    nested = [_with_branches(node) for node in proto.graph.node]
    sequences = any(inner.op_type.startswith(SEQUENCE_PREFIXES) for found in nested for inner in found)
    refused: dict[int, str] = {}
    for index, (node, found) in enumerate(zip(proto.graph.node, nested)):
        missing = sorted({n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
                          for n in found if n.domain not in ("", "ai.onnx") or n.op_type not in converted})
        inexact = list(exactness.inexact_nodes(found, facts).values())
        if missing:
            refused[index] = f"{', '.join(missing)}: TVM's importer does not convert it"
        elif inexact:
            refused[index] = inexact[0]
        elif node.op_type in DATA_DEPENDENT:
            refused[index] = f"{node.op_type}: its output shape depends on the data"
        elif sequences and any(name in facts.non_tensors for name in list(node.input) + list(node.output)):
            refused[index] = f"{node.op_type}: reads or makes a sequence or optional"
    return refused


def _with_branches(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    found = [node]
    for attr in node.attribute:
        for graph in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            for inner in graph.node:
                found += _with_branches(inner)
    return found


class Capability(Protocol):
    """What the partition asks of an external backend: the operator domains it runs, and why it
    would answer a node differently from ONNX (None: it runs it right)."""

    domains: frozenset[str]

    def refuses(self, node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]]) -> str | None: ...


def assign(proto: onnx.ModelProto, refused: Mapping[int, str], external: Mapping[str, Capability],
           facts: exactness.Facts, overrides: Mapping[str, str] | None = None,
           chosen: Mapping[int, str] | None = None) -> dict[int, str]:
    """Each node's backend: what ``chosen`` (measured) says where that backend runs it right, else
    relaxc; nodes relaxc refuses go to the first of ``external`` that runs them right;
    ``overrides`` (node name glob -> backend) pin nodes last, whatever the backend's rules say."""
    assignment = {}
    for index, node in enumerate(proto.graph.node):
        name = node.name or node.output[0]
        why_not = {backend: _refusal(node, capability, facts) for backend, capability in external.items()}
        backend = (chosen or {}).get(index, RELAXC)
        if backend != RELAXC and why_not.get(backend):
            backend = RELAXC
        if index in refused and backend == RELAXC:
            backend = next((b for b, why in why_not.items() if why is None), None)
            if backend is None and external:
                raise UnsupportedOperatorError(f"node {name!r} ({refused[index]}) runs right on no installed backend: "
                                               + "; ".join(f"{b}: {why}" for b, why in why_not.items()))
        for pattern, pinned in (overrides or {}).items():
            if fnmatch.fnmatchcase(name, pattern):
                backend = pinned
        if backend == RELAXC and index in refused:
            raise UnsupportedOperatorError(f"node {name!r} cannot run on relaxc ({refused[index]})")
        if backend is None:
            why = "; ".join(sorted(set(refused.values()))[:8])
            raise UnsupportedOperatorError(f"{len(refused)} node(s) relaxc cannot compile ({why}) and no external "
                                           f"backend is installed to run them: pip install 'relaxc[onnxruntime]'")
        if backend != RELAXC and backend not in external:
            raise UserError(f"node {name!r} is pinned to {backend!r}, which is not installed here "
                            f"(installed: {', '.join(external) or 'none'})")
        assignment[index] = backend
    return assignment


def _refusal(node: onnx.NodeProto, capability: Capability, facts: exactness.Facts) -> str | None:
    """Why ``capability`` cannot run ``node`` (with its branches) right, or None."""
    for inner in _with_branches(node):
        if (inner.domain or "ai.onnx") not in capability.domains:
            return f"it does not run the {inner.domain} domain"
        if inner.op_type in getattr(capability, "guarded", ()):
            why = capability.refuses(inner, facts.shapes)
            if why:
                return why
    return None


class Graph:
    """Producers and readers of the prepared graph's values, node by index."""

    def __init__(self, proto: onnx.ModelProto, refused: Collection[int] = ()) -> None:
        self.nodes = list(proto.graph.node)
        self.reads = [set(n.input) | prepare.subgraph_inputs(n) for n in self.nodes]
        self.producer = {name: i for i, n in enumerate(self.nodes) for name in n.output if name}
        self.readers: dict[str, list[int]] = collections.defaultdict(list)
        for i, names in enumerate(self.reads):
            for name in names:
                self.readers[name].append(i)
        self.successors = [sorted({r for name in n.output if name for r in self.readers.get(name, [])})
                           for n in self.nodes]
        self.predecessors = [sorted({self.producer[name] for name in names if name in self.producer})
                             for names in self.reads]
        weights = {t.name for t in proto.graph.initializer}
        self.constant: set[int] = set()  # nodes computed from weights alone (a light model's weight fills)
        for i, node in enumerate(self.nodes):  # a node relaxc refuses is no copy it could take
            if i not in refused and not node.op_type.startswith(RANDOM_PREFIXES) and all(
                    name in weights or self.producer.get(name) in self.constant for name in self.reads[i] if name):
                self.constant.add(i)

    def with_constants(self, part: set[int]) -> list[int]:
        """``part`` with the weight computations it reads, which every subgraph gets a copy of: a
        backend that got them as inputs could not prepare its weights ahead of the run."""
        needed = set(part)
        stack = [p for i in part for p in self.predecessors[i] if p in self.constant]
        while stack:
            node = stack.pop()
            if node not in needed:
                needed.add(node)
                stack += [p for p in self.predecessors[node] if p in self.constant]
        return sorted(needed)

    def leaving(self, part: set[int], outputs: set[str]) -> list[str]:
        """The values ``part`` makes that the model returns or a node outside it reads; never a
        weight computation's (each part has its own copy)."""
        return [name for i in sorted(part) if i not in self.constant for name in self.nodes[i].output
                if name and (name in outputs or any(r not in part for r in self.readers.get(name, [])))]

    def reach(self, start: set[int], forward: bool) -> set[int]:
        edges = self.successors if forward else self.predecessors
        seen, stack = set(), list(start)
        while stack:
            for nxt in edges[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return seen


def _components(graph: Graph, assignment: dict[int, str]) -> list[set[int]]:
    """The external nodes of one backend that touch each other, as sets."""
    seen: set[int] = set()
    found = []
    for start, backend in assignment.items():
        if backend == RELAXC or start in seen:
            continue
        part, stack = {start}, [start]
        while stack:
            node = stack.pop()
            for nxt in graph.successors[node] + graph.predecessors[node]:
                if nxt not in part and assignment.get(nxt) == backend:
                    part.add(nxt)
                    stack.append(nxt)
        seen |= part
        found.append(part)
    return found


def _make_convex(graph: Graph, assignment: dict[int, str]) -> None:
    """Nodes on a path that leaves a subgraph and comes back join it, until none is left."""
    changed = True
    while changed:
        changed = False
        for part in _components(graph, assignment):
            between = (graph.reach(part, True) & graph.reach(part, False)) - part
            if between:
                backend = assignment[next(iter(part))]
                for node in between:
                    assignment[node] = backend
                changed = True
                break


def plan(proto: onnx.ModelProto, inputs: list[TensorSpec], facts: exactness.Facts,
         assignment: dict[int, str], refused: Mapping[int, str]) -> Plan:
    """The subgraphs of ``assignment`` made convex, the tail split off, each as an ONNX model."""
    graph = Graph(proto, refused)
    assignment = dict(assignment)
    _make_convex(graph, assignment)
    outputs = {value.name for value in proto.graph.output}
    leaving = functools.partial(graph.leaving, outputs=outputs)

    # the tail: every node after one whose leaving value has no static shape, or is no tensor; the
    # whole model where one backend runs it all (no call into the library from relaxc's program)
    placed = {b for i, b in assignment.items() if i not in graph.constant}
    tail: set[int] = set(assignment) if len(placed) == 1 and RELAXC not in placed else set()
    for part in _components(graph, assignment):
        for name in leaving(part):
            if name not in facts.shapes or name in facts.non_tensors:
                start = {graph.producer[name]}
                tail |= start | graph.reach(start, True)
    if tail:
        backend = assignment[min(i for i in tail if assignment[i] != RELAXC)]
        for node in tail:  # the calls left stay convex: nothing after the tail comes back
            assignment[node] = backend
    calls = sorted(((part, made) for part in _components(graph, {i: b for i, b in assignment.items() if i not in tail})
                    if (made := leaving(part))), key=lambda call: min(call[0]))
    subgraphs = [_subgraph(proto, graph, facts, part, assignment, refused, made, False) for part, made in calls]
    if tail:
        tail_outputs = [v.name for v in proto.graph.output if graph.producer.get(v.name) in tail]
        subgraphs.append(_subgraph(proto, graph, facts, tail, assignment, refused, tail_outputs, True))
    own = {i for i, backend in assignment.items() if backend == RELAXC and i not in tail}
    own |= {graph.producer[v.name] for v in proto.graph.output  # weight computations the model returns
            if graph.producer.get(v.name) in graph.constant and graph.producer[v.name] not in tail}
    relaxc_nodes = [graph.nodes[i] for i in graph.with_constants(own)]
    if len(tail) == len(graph.nodes):
        subgraphs[0].alone = True
    call_outputs = [spec for sub in subgraphs if not sub.tail for spec in sub.outputs]
    tail_inputs = subgraphs[-1].inputs if tail else []
    program_outputs = _unique([v.name for v in proto.graph.output if graph.producer.get(v.name) not in tail]
                              + tail_inputs)
    call_inputs = [name for sub in subgraphs if not sub.tail for name in sub.inputs]
    relaxc_inputs = list(inputs) + call_outputs
    relaxc = _model(proto, relaxc_nodes, relaxc_inputs, _unique(program_outputs + call_inputs), facts)
    return Plan(relaxc, relaxc_inputs, program_outputs, subgraphs)


def _unique(names: list[str]) -> list[str]:
    return list(dict.fromkeys(names))


def _subgraph(proto: onnx.ModelProto, graph: Graph, facts: exactness.Facts, part: set[int],
              assignment: dict[int, str], refused: Mapping[int, str], outputs: list[str], tail: bool,
              shapes: Mapping[str, tuple[int, ...]] | None = None) -> Subgraph:
    nodes = graph.with_constants(part)
    made = {name for i in nodes for name in graph.nodes[i].output}
    initializers = {t.name for t in proto.graph.initializer}
    graph_inputs = {v.name for v in proto.graph.input}
    read = _unique([name for i in nodes for name in graph.nodes[i].input if name]
                   + sorted(name for i in nodes for name in prepare.subgraph_inputs(graph.nodes[i])
                            if name in graph.producer or name in graph_inputs))
    inputs = [name for name in read if name not in made and name not in initializers]
    specs = [(name, facts.shapes.get(name), _dtype(facts.types.get(name, onnx.TensorProto.UNDEFINED)))
             for name in outputs]
    input_specs = [(name, (shapes or {}).get(name, facts.shapes.get(name)),
                    _dtype(facts.types.get(name, onnx.TensorProto.UNDEFINED))) for name in inputs]
    crossing = [name for name, _, dtype in input_specs + specs if dtype in UNBOUND_TYPES]
    if crossing:
        raise UnsupportedOperatorError(f"values {crossing} would cross between relaxc and {assignment[min(part)]} "
                                       f"as {', '.join(sorted(UNBOUND_TYPES))}, which neither hands over")
    model = _model(proto, [graph.nodes[i] for i in nodes], input_specs, outputs, facts)
    reasons = sorted({refused[i] for i in part if i in refused})
    return Subgraph(assignment[min(part)], inputs, specs, tail, model.SerializeToString(), nodes=sorted(part),
                    ops=dict(collections.Counter(graph.nodes[i].op_type for i in part)),
                    why="; ".join(reasons[:3]) + ("; ..." if len(reasons) > 3 else ""))


def _dtype(elem_type: int) -> str:
    return "" if elem_type == onnx.TensorProto.UNDEFINED else str(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def _value_info(name: str, facts: exactness.Facts, shape: tuple[int, ...] | None = None) -> onnx.ValueInfoProto:
    shape = shape if shape is not None else facts.shapes.get(name)
    return onnx.helper.make_tensor_value_info(name, facts.types.get(name, onnx.TensorProto.UNDEFINED), shape)


def _model(proto: onnx.ModelProto, nodes: list[onnx.NodeProto], inputs: list[TensorSpec], outputs: list[str],
           facts: exactness.Facts) -> onnx.ModelProto:
    """A model of ``nodes`` with these inputs and outputs, the initializers they read and the
    model's opsets and functions."""
    read = {name for node in nodes for name in list(node.input) + sorted(prepare.subgraph_inputs(node))}
    values = {v.name: v for v in list(proto.graph.input) + list(proto.graph.output) + list(proto.graph.value_info)}
    graph = onnx.helper.make_graph(
        nodes, proto.graph.name or "part",
        [_value_info(name, facts, shape) for name, shape, _ in inputs],
        [values[name] if name in values and name not in facts.shapes else _value_info(name, facts)
         for name in outputs],
        [t for t in proto.graph.initializer if t.name in read])
    model = onnx.helper.make_model(graph, opset_imports=list(proto.opset_import), functions=list(proto.functions))
    model.ir_version = proto.ir_version
    return model


def segments(proto: onnx.ModelProto, count: int) -> list[list[int]]:
    """The graph's nodes cut into about ``count`` runs of consecutive nodes, each cut where the
    fewest values cross it within a window around the even split: the units measured per backend.
    Weight computations cross no cut (each segment gets its copy, ``part``) and form no segment
    alone: one of ResNet-50's light weight fills measured 4.9 ms a run, all of it copying out weights."""
    graph = Graph(proto)
    total = len(graph.nodes)
    outputs = {value.name for value in proto.graph.output}
    last_read = {name: max(readers) for name, readers in graph.readers.items()}
    crossing, live = [0] * (total + 1), 0
    ends: dict[int, int] = collections.Counter()
    for k, node in enumerate(graph.nodes):  # values made before k and read at or after it
        live -= ends[k]
        crossing[k] = live
        for name in node.output:
            if name and (name in outputs or (k not in graph.constant and last_read.get(name, -1) > k)):
                live += 1
                ends[total + 1 if name in outputs else last_read[name] + 1] += 1
    count = max(1, min(count, total))
    window = max(1, total // (2 * count))
    cuts = [0]
    for i in range(1, count):
        ideal = total * i // count
        candidates = range(max(cuts[-1] + 1, ideal - window), min(total, ideal + window + 1))
        if candidates:
            cuts.append(min(candidates, key=lambda k: (crossing[k], abs(k - ideal))))
    cuts.append(total)
    spans: list[list[int]] = []
    for a, b in zip(cuts, cuts[1:]):
        if spans and all(i in graph.constant for i in spans[-1]):
            spans[-1] += range(a, b)
        elif b > a:
            spans.append(list(range(a, b)))
    return spans


def part(proto: onnx.ModelProto, facts: exactness.Facts, nodes: list[int], backend: str,
         shapes: Mapping[str, tuple[int, ...]] | None = None) -> Subgraph:
    """``nodes`` as a model of their own for ``backend``: inputs what they read from elsewhere
    (of ``shapes``, where given), outputs what is read after them."""
    graph = Graph(proto)
    chosen = set(nodes)
    leaving = graph.leaving(chosen, {value.name for value in proto.graph.output})
    return _subgraph(proto, graph, facts, chosen, {i: backend for i in nodes}, {}, leaving, False, shapes)


def with_outputs(proto: onnx.ModelProto, facts: exactness.Facts, names: list[str]) -> onnx.ModelProto:
    """The whole model with ``names`` among its outputs too (to read values inside it)."""
    inputs = [(v.name, facts.shapes.get(v.name), "") for v in proto.graph.input
              if v.name not in {t.name for t in proto.graph.initializer}]
    return _model(proto, list(proto.graph.node), inputs,
                  _unique([v.name for v in proto.graph.output] + names), facts)
