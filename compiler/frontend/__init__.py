"""The prepare and import phases: ONNX (path, bytes, ModelProto or ``onnx:<name>``) to a Relax IRModule.

Everything that can be wrong with the model is checked here, before any compile work, and
reported as a UserError: unreadable file, not ONNX, checker failure, every unsupported operator at
once with node names, and dynamic dimensions the caller did not bind. Inputs the caller fixes at
compile time (``constants``) become initializers first, so shape computations over them fold.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from dataclasses import dataclass
from typing import Mapping, Sequence, Union

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from tvm import IRModule

from relaxc.frontend import (decompose, exactness, functions, models, partition, prepare, qoperators, relax_import,
                             rewrites, splice)
from relaxc.support.tensors import TensorSpec
from relaxc.support import tvm_internals
from relaxc.support.errors import (InputError, ModelError, ShapeError,
                                   UnsupportedOperatorError, message)

ModelLike = Union[str, os.PathLike, bytes, onnx.ModelProto]
Shapes = Mapping[str, Sequence[int]]
DimBounds = Mapping[str, int]  # a dynamic dim's name -> the largest size it takes
Constants = Mapping[str, np.ndarray]

# Ops the importer handles itself rather than through its converter table. Ops it converts
# wrongly in some form are refused by compiler/frontend/exactness.py.
_BUILTIN_OPS = {"If", "Constant"}
_ONNX_DOMAINS = {"", "ai.onnx"}


@dataclass
class ImportedModel:
    """A validated model and its Relax module; inputs/outputs keep the ONNX names, ``onnx_names``
    maps the Relax parameters that had to be renamed (see ``relax_import.identifier_inputs``) back to them."""

    name: str
    module: IRModule
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    ops: dict[str, int]
    onnx_names: dict[str, str]
    input_high: dict[str, int]  # integer inputs' exclusive bounds the model declares (models.input_high)
    index_readers: dict[str, str]  # Relax parameter -> the nodes indexing with it, for error messages
    subgraphs: list[partition.Subgraph] = dataclasses.field(default_factory=list)  # run by external backends
    program_outputs: list[str] | None = None  # what relaxc's program returns, where not the outputs
    dim_bounds: dict[str, int] = dataclasses.field(default_factory=dict)  # each dynamic dim's largest size


@dataclass(frozen=True)
class Served:
    """A backend running the whole model instead of relaxc's program at the sizes whose work (the
    product of the dynamic dims) is in [``low``, ``high``); ``whole_from`` as in ``Partitioning``."""

    backend: str
    low: int
    high: int
    whole_from: bytes | None = None


@dataclass(frozen=True)
class Partitioning:
    """Which external backends may run nodes: ``external`` (installed, in order of preference, each
    with what it runs right) runs what relaxc cannot; ``chosen`` (node index -> backend,
    measured) and ``overrides`` (node name glob -> backend) place other nodes; ``by_size``: the
    backends that run a dynamic model whole at some sizes instead. Empty ``external``: relaxc's own
    kernels only."""

    external: Mapping[str, partition.Capability] = dataclasses.field(default_factory=dict)
    overrides: Mapping[str, str] = dataclasses.field(default_factory=dict)
    chosen: Mapping[int, str] = dataclasses.field(default_factory=dict)
    whole_from: bytes | None = None  # where one backend runs it all: this form of the model (the export)
    by_size: tuple[Served, ...] = ()


@dataclass
class Prepared:
    """A validated model with its shape computations folded: what partitioning and import read."""

    proto: onnx.ModelProto
    name: str
    ops: dict[str, int]
    inputs: list[TensorSpec]
    bounds: dict[str, int] = dataclasses.field(default_factory=dict)  # each dynamic dim's largest size
    empty_dims: tuple[str, ...] = ()  # dynamic dims that may be 0 (a decoder's past), the others at least 1
    sums: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # a dim that is others' sum


def load_model(model: ModelLike) -> tuple[onnx.ModelProto, str, str | None]:
    """Read the model; returns (proto, display name, path or None). Raises ModelError."""
    if isinstance(model, onnx.ModelProto):
        return model, model.graph.name or "model", None
    if isinstance(model, bytes):
        return _parse(model, "<bytes>"), "model", None
    if models.is_bundled(model):
        path = models.bundled_path(model)
        proto = _parse_file(path)
        if models.is_light(proto):  # zoo: weights filled at load; check the filled proto, not the path
            return models.fill_light(proto), model, None
        return proto, model, path
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise ModelError(f"model file not found: {path}")
        if os.path.isdir(path):
            raise ModelError(f"model path is a directory, not an .onnx file: {path}")
        return _parse_file(path), os.path.splitext(os.path.basename(path))[0], path
    raise ModelError(f"model must be a path, bytes, onnx.ModelProto or 'onnx:<name>', "
                     f"not {type(model).__name__}")


def _parse_file(path: str) -> onnx.ModelProto:
    try:
        return _check_parsed(onnx.load(path), path)
    except (DecodeError, ValueError, RuntimeError, OSError) as err:
        raise ModelError(f"{path} is not a readable ONNX model: {message(err)}") from None


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    try:
        return _check_parsed(onnx.load_model_from_string(data), where)
    except (DecodeError, ValueError, RuntimeError) as err:
        raise ModelError(f"{where} is not a readable ONNX model: {message(err)}") from None


def _check_parsed(proto: onnx.ModelProto, where: str) -> onnx.ModelProto:
    # Protobuf parses many non-ONNX byte strings into an empty message without complaint.
    if proto.ir_version == 0 or not proto.HasField("graph"):
        raise ModelError(f"{where} is not an ONNX model (no IR version or graph in the file)")
    return proto


def check_model(proto: onnx.ModelProto, path: str | None) -> None:
    """Run onnx.checker (on the path when there is one, so models over 2 GiB work)."""
    try:
        onnx.checker.check_model(path if path is not None else proto)
    except (onnx.checker.ValidationError, ValueError) as err:
        raise ModelError(f"model fails the ONNX checker: {message(err)}") from None


def converted_operators() -> set[str]:
    """The ONNX op types TVM's importer converts."""
    return tvm_internals.onnx_converters() | _BUILTIN_OPS


def check_operators(graph: onnx.GraphProto, decomposable: frozenset[str] = frozenset()) -> None:
    """Raise UnsupportedOperatorError listing every unsupported op type with its node names; op types
    in ``decomposable`` pass (``decompose`` writes them out later, when their form allows)."""
    supported = converted_operators() | decomposable
    missing: dict[str, list[str]] = collections.defaultdict(list)
    for index, node in enumerate(prepare.all_nodes(graph)):
        key = node.op_type if node.domain in _ONNX_DOMAINS else f"{node.domain}::{node.op_type}"
        if node.domain not in _ONNX_DOMAINS or node.op_type not in supported:
            missing[key].append(node.name or f"#{index}")
    if missing:
        parts = [f"{op} (nodes: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
                 for op, names in sorted(missing.items())]
        raise UnsupportedOperatorError(f"{len(missing)} unsupported operator type(s): " + "; ".join(parts))


def graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """The real inputs: old (IR v3) models also list their initializers among the inputs."""
    initializers = {init.name for init in graph.initializer}
    return [value for value in graph.input if value.name not in initializers]


def _dtype(value: onnx.ValueInfoProto) -> str:
    return str(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))


def bind_constants(proto: onnx.ModelProto, constants: Constants | None) -> onnx.ModelProto:
    """A copy of ``proto`` whose inputs named in ``constants`` are initializers of those values.

    For inputs that a static-shape compiler needs at compile time (reduction axes, pads, a
    Reshape's shape, TopK's k given as graph inputs): the artifact then no longer takes them."""
    if not constants:
        return proto
    inputs = {value.name: value for value in graph_inputs(proto.graph)}
    unknown = sorted(set(constants) - set(inputs))
    if unknown:
        raise InputError(f"constants names unknown input(s) {unknown}; the model's inputs are {list(inputs)}")
    initializers = []
    for name, value in constants.items():
        array, declared = np.asarray(value), inputs[name]
        if array.dtype != np.dtype(_dtype(declared)):
            raise InputError(f"constant {name!r}: the input's dtype is {_dtype(declared)}, got {array.dtype}")
        dims = declared.type.tensor_type.shape.dim
        if len(dims) != array.ndim or any(d.HasField("dim_value") and d.dim_value != size
                                          for d, size in zip(dims, array.shape)):
            raise ShapeError(f"constant {name!r}: shape {array.shape} does not fit the input's "
                             f"{[d.dim_value if d.HasField('dim_value') else d.dim_param or '?' for d in dims]}")
        initializers.append(onnx.numpy_helper.from_array(array, name))
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    kept = [value for value in copy.graph.input if value.name not in constants]
    del copy.graph.input[:]
    copy.graph.input.extend(kept)
    copy.graph.initializer.extend(initializers)
    return copy


def bind_shapes(graph: onnx.GraphProto, shapes: Shapes | None, dim_bounds: DimBounds | None = None) -> list[TensorSpec]:
    """(name, shape, dtype) of each input, with ``shapes`` binding dynamic dims to sizes and the
    others kept by name, each needing a bound in ``dim_bounds``."""
    shapes, bounds = dict(shapes or {}), dict(dim_bounds or {})
    inputs = graph_inputs(graph)
    unknown = set(shapes) - {value.name for value in inputs}
    if unknown:
        raise ShapeError(f"shapes names unknown input(s) {sorted(unknown)}; the model's inputs are "
                         f"{[value.name for value in inputs]}")
    specs, named = [], set()
    for value in inputs:
        dims = value.type.tensor_type.shape.dim
        given = shapes.get(value.name)
        if given is not None:
            given = tuple(int(d) for d in given)
            if len(given) != len(dims):
                raise ShapeError(f"input {value.name!r} has rank {len(dims)}, but shapes gives "
                                 f"{len(given)} dims {given}")
            for axis, (dim, size) in enumerate(zip(dims, given)):
                if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != size:
                    raise ShapeError(f"input {value.name!r} dim {axis} is fixed to {dim.dim_value} "
                                     f"in the model, but shapes gives {size}")
                if size < 0:
                    raise ShapeError(f"input {value.name!r} dim {axis}: size must not be negative, got {size}")
            specs.append((value.name, given, _dtype(value)))
            continue
        shape: list[int | str] = []
        for axis, dim in enumerate(dims):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                shape.append(dim.dim_value)
                continue
            name = dim.dim_param
            if not name or name not in bounds:
                label = f" ({name!r})" if name else " (unnamed)"
                how = (f"give it an upper bound with dim_bounds={{{name!r}: N}} (--dim-bound {name}=N), or "
                       if name else "")
                raise ShapeError(f"input {value.name!r} has a dynamic dimension {axis}{label}; {how}bind it "
                                 f"with shapes={{{value.name!r}: (...)}} or --shape {value.name}=...")
            shape.append(name)
            named.add(name)
        specs.append((value.name, tuple(shape), _dtype(value)))
    unused = sorted(set(bounds) - named)
    if unused:
        dynamic = sorted({d.dim_param for v in inputs for d in v.type.tensor_type.shape.dim if d.dim_param})
        raise ShapeError(f"dim_bounds names dim(s) {unused} that no dynamic input dim has; the model's are "
                         f"{dynamic or 'none'}")
    for name, bound in bounds.items():
        if not isinstance(bound, (int, np.integer)) or isinstance(bound, bool) or bound < 1:
            raise ShapeError(f"dim_bounds[{name!r}] must be a whole number of at least 1, got {bound!r}")
    return specs


QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QGemm"}
INDEX_OPS = ("Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND", "Scatter")
VALUE_KEEPING_OPS = ("Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")


def _index_readers(graph: onnx.GraphProto) -> dict[str, str]:
    """Each graph input that nodes index with (as it is, or through ops that keep its values):
    those nodes, as an error message names them ("Gather 'word_embeddings'")."""
    inputs = {i.name for i in graph.input}
    producers = {node.output[0]: node for node in graph.node if node.op_type in VALUE_KEEPING_OPS}
    readers: dict[str, list[str]] = collections.defaultdict(list)
    for node in graph.node:
        if node.op_type in INDEX_OPS and len(node.input) > 1:
            source = node.input[1]
            while source in producers:
                source = producers[source].input[0]
            if source in inputs:
                readers[source].append(f"{node.op_type} {node.name!r}" if node.name else node.op_type)
    return {name: ", ".join(nodes) for name, nodes in readers.items()}


def prepare_model(model: ModelLike, shapes: Shapes | None = None, constants: Constants | None = None,
                  strict: bool = True, dim_bounds: DimBounds | None = None,
                  empty_dims: Sequence[str] = (), sums: Mapping[str, Sequence[str]] | None = None) -> Prepared:
    """Validate the model, bind its shapes and fold what they decide; ``strict``: refuse operators
    TVM's importer does not convert here, rather than leave them to an external backend;
    ``dim_bounds``: the largest size of each dynamic dim kept dynamic; ``empty_dims``: those of
    them that may be 0; ``sums``: dims that are the sum of others (a decoder's mask covers
    ``past + sequence``), imported as that sum so that shapes computed either way agree."""
    proto, name, path = load_model(model)
    check_model(proto, path)
    ops = collections.Counter(node.op_type for node in prepare.all_nodes(proto.graph))  # as the user's model has them
    proto = qoperators.to_qdq(functions.expand(proto, converted_operators()))
    if strict:
        check_operators(proto.graph, decompose.OPERATORS)
    proto = bind_constants(proto, constants)
    problems = exactness.graph_problems(proto)
    if problems:
        raise UnsupportedOperatorError("; ".join(problems))
    inputs = bind_shapes(proto.graph, shapes, dim_bounds)
    quantized = sorted({op for op in ops if op in QUANTIZED_OPS or op.startswith("QLinear")})
    if dim_bounds and quantized:
        raise ShapeError(f"quantized models ({', '.join(quantized)}) with dynamic dims are not supported yet: "
                         f"bind the dims with shapes= (--shape)")
    bound = {name: shape for name, shape, _ in inputs}
    proto = rewrites.rewrite(prepare.fold_shape_computations(proto, bound), bound)
    proto = decompose.decompose(proto, bound)
    return Prepared(proto, name, dict(sorted(ops.items())), inputs, dict(dim_bounds or {}), tuple(empty_dims),
                    {dim: tuple(parts) for dim, parts in (sums or {}).items()})


def import_model(model: ModelLike, shapes: Shapes | None = None, constants: Constants | None = None,
                 partitioning: Partitioning = Partitioning()) -> ImportedModel:
    """Validate the model and convert it to Relax; every failure is a UserError."""
    return convert(prepare_model(model, shapes, constants, strict=not partitioning.external), partitioning)


def convert(prepared: Prepared, partitioning: Partitioning = Partitioning()) -> ImportedModel:
    """The prepared model in Relax: all of it, or relaxc's part with the external subgraphs as
    calls; with the whole model on each backend of ``partitioning.by_size`` beside it."""
    imported = _convert(prepared, partitioning)
    everything = range(len(prepared.proto.graph.node))
    for served in partitioning.by_size:
        whole = Partitioning(partitioning.external, chosen=dict.fromkeys(everything, served.backend),
                             whole_from=served.whole_from)
        (sub,) = _convert(prepared, whole).subgraphs
        imported.subgraphs.append(dataclasses.replace(sub, serves=(served.low, served.high),
                                                      why="measured faster at these sizes"))
    return imported


def _convert(prepared: Prepared, partitioning: Partitioning) -> ImportedModel:
    proto, inputs = prepared.proto, prepared.inputs
    nodes = list(prepare.all_nodes(proto.graph))
    facts = exactness.Facts(proto, inputs, nodes)  # shapes inferred once, when a rule first asks
    if partitioning.external:
        refused = partition.refused_nodes(proto, facts, converted_operators())
        if refused or partitioning.overrides or set(partitioning.chosen.values()) - {partition.RELAXC}:
            assignment = partition.assign(proto, refused, partitioning.external, facts, partitioning.overrides,
                                          partitioning.chosen)
            if set(assignment.values()) != {partition.RELAXC}:
                plan = partition.plan(proto, inputs, facts, assignment, refused)
                if partitioning.whole_from is not None and plan.subgraphs[0].alone:
                    names = [name for name, _, _ in inputs]
                    plan = dataclasses.replace(plan, program_outputs=names, subgraphs=[dataclasses.replace(
                        plan.subgraphs[0], model=partitioning.whole_from, inputs=names)])
                return _convert_partitioned(prepared, plan)
    check_operators(proto.graph)
    exactness.refuse_inexact(proto, inputs, nodes, facts)
    module, names = relax_import.from_onnx_model(proto, inputs, prepared.bounds, prepared.empty_dims, prepared.sums)
    outputs = relax_import.output_specs([value.name for value in proto.graph.output], module)
    return ImportedModel(prepared.name, module, inputs, outputs, prepared.ops,
                         {new: old for old, new in names.items() if new != old}, models.input_high(proto),
                         {names[n]: nodes for n, nodes in _index_readers(proto.graph).items() if n in names},
                         dim_bounds=prepared.bounds)


def _convert_partitioned(prepared: Prepared, plan: partition.Plan) -> ImportedModel:
    proto, inputs = prepared.proto, prepared.inputs
    part = plan.relaxc
    module, names = relax_import.from_onnx_model(part, plan.relaxc_inputs, prepared.bounds, prepared.empty_dims,
                                                 prepared.sums)
    calls = [splice.Call(sub.function, sub.inputs, sub.outputs) for sub in plan.subgraphs if not sub.tail]
    results = [value.name for value in part.graph.output]
    module = splice.splice(module, [n for n, _, _ in plan.relaxc_inputs], results, plan.program_outputs, calls)
    tail = next((sub for sub in plan.subgraphs if sub.tail), None)
    specs = relax_import.output_specs(plan.program_outputs, module) + (tail.outputs if tail else [])
    made = {spec[0]: spec for spec in specs}
    outputs = [made[value.name] for value in proto.graph.output]
    real = [n for n, _, _ in inputs]
    return ImportedModel(prepared.name, module, inputs, outputs, prepared.ops,
                         {new: old for old, new in names.items() if new != old and old in real},
                         models.input_high(proto),
                         {names[n]: nodes for n, nodes in _index_readers(part.graph).items() if n in real},
                         plan.subgraphs, plan.program_outputs, prepared.bounds)
