"""Which backend runs each part of a model: relaxc's own kernels, or an installed external library.

Modes (``Options.backends``, the modes of every measured decision: ``schedules/decisions.py``):
``off`` uses relaxc's kernels only; ``rule`` sends to the first installed external backend that
runs their operators (onnxruntime, then OpenVINO) exactly the nodes relaxc cannot compile, and the
whole model where TVM fails on relaxc's part; ``replay`` does the same and applies the partition
measured for this model on this CPU before (the ``backends`` decisions of the target's store);
``measure`` measures it first where there is none.

Measuring (``compiler/build/backend_costs.py``): the whole model on relaxc (with the fallback) and on
each installed backend alone; the graph cut into segments where fewest values cross, each segment
timed on each backend on the values the model really makes there; the cheapest assignment of
segments to backends compiled and timed against the single-backend ones, in alternating blocks
(``compiler/build/backend_candidates.py``), with the memory each holds. Segments not measured within
``measure_budget_s`` stay on relaxc. A model with dynamic dims is measured whole only (a cut inside
relaxc's program needs static shapes at it), at a quarter and a sixteenth of its bounds, each
candidate's times there in a geometric mean; where another candidate is faster by more than
``SPLIT`` at one size, it runs the sizes near that one (``by_size``). The strategy
(``Options.strategy``) picks: ``latency`` the fastest, ``memory`` the smallest (those within
``SAME_MEMORY`` of it: the fastest). A measurement is keyed by the model's structure and shapes
(not its weights) and the strategy (under ``memory`` relaxc's convolutions are other builds), with
the backends' versions.
"""

from __future__ import annotations

import hashlib
import logging
import math
from typing import Callable

import onnx

from relaxc.build import backend_costs
from relaxc.runtime import external
from relaxc import frontend
from relaxc.build.backend_candidates import EXPORT, Build
from relaxc.build.backend_costs import size_label, sizes
from relaxc.frontend import partition
from relaxc.build.options import Config
from relaxc.support.errors import DynamicOutputError, ImportFailure, UserError, message

log = logging.getLogger("relaxc")

SAME_MEMORY = 1.05  # candidates within this of the smallest count as equally small: resident memory is noisy
# a dynamic model's sizes go to another backend than the fastest overall only where it is this much
# faster there: each backend serving some sizes is one more build held (BERT at batch 4, sequence 96
# ran 1.09x OpenVINO on relaxc's kernels, which are the fastest at a sixteenth of its bounds)
SPLIT = 1.02


def partitioning(prepared: frontend.Prepared, config: Config, build: Build,
                 export: Callable[[], bytes]) -> tuple[frontend.Partitioning, dict]:
    """The partition to compile ``prepared`` with, and how it was chosen (``report()["backends"]``).
    ``export``: the model as the user gave it (constants bound), for a library that runs it whole:
    relaxc's folding can make it faster there (Swin-T on onnxruntime, 84.9 ms against 93.4) or
    slower (MobileNetV2, 7.8 against 6.5: weights copied out of Identity nodes), so both are measured."""
    cpu = config.target.kind.name == "llvm"
    if prepared.bounds and config.backend_overrides:
        raise UserError("backend_overrides do not apply to a model with dynamic dims yet (a subgraph inside "
                        "relaxc's program needs static shapes at its boundary): bind them with shapes= (--shape)")
    if config.backends == "off" or not cpu:
        if config.backend_overrides:
            raise UserError("backend_overrides pin nodes to external backends, which run on CPU targets only: "
                            "not with backends='off' or a GPU target")
        return frontend.Partitioning(), {} if cpu else {"why": "external backends run on CPU targets only"}
    installed = {name: external.get(name) for name in external.installed()}
    base = frontend.Partitioning(installed, dict(config.backend_overrides))
    if config.backends == "rule" or not installed:
        return base, {}
    store = config.decisions("backends")
    key = structure_key(prepared) + ("" if config.strategy == "latency" else f"-{config.strategy}")
    entry = store.load().get(key)
    if entry is None and config.backends != "measure":  # the libraries are imported only when a plan uses them
        store.missing(f"{prepared.name} ({key})", "compile once with backends='measure' on this CPU, or choose by "
                      "the rule: backends='rule'")
        return base, {"decision": "none stored for this model and CPU (compile with backends='measure')"}
    versions = {name: external.get(name).version() for name in installed}
    if config.backends == "measure" and (entry is None or entry["versions"] != versions):
        entry = backend_costs.measure(prepared, base, config.measure_budget_s, build, export)
        # "choice" is what relaxc before the strategies read from a shared store
        entry |= {"choice": decide(entry, "latency"), "versions": versions}
        store.save(key, entry)
    usable = {partition.RELAXC} | {name for name in installed if entry["versions"].get(name) == versions[name]}
    choice = decide(entry, config.strategy)
    if not set(_chosen(entry, choice, 1).values()) <= usable:
        installed_here = {name for name in entry["ms"] if name.removesuffix(EXPORT) in usable}
        if not installed_here:
            raise UserError(f"the stored measurement for {prepared.name} has no candidate installed here: "
                            "compile with backends='measure' to measure again")
        best = decide(entry, config.strategy, installed_here)
        log.warning("the stored decision for %s runs %s on a backend not installed here (or of another version "
                    "than measured): the best installed choice measured, %s, runs it", prepared.name, choice, best)
        choice = best
    ranges = by_size(entry, prepared.bounds, {name for name in entry["ms"] if name.removesuffix(EXPORT) in usable}) \
        if "ms_by_size" in entry and config.strategy == "latency" else []
    if len(ranges) > 1:  # relaxc's program wherever it is fastest, else the fastest at the largest size
        choice = partition.RELAXC if any(name == partition.RELAXC for name, _, _ in ranges) else ranges[-1][0]
    served = tuple(frontend.Served(name.removesuffix(EXPORT), low, high, export() if name.endswith(EXPORT) else None)
                   for name, low, high in ranges if name != choice)
    chosen = _chosen(entry, choice, len(prepared.proto.graph.node))
    summary = {"decision": choice, "strategy": config.strategy, "measured_ms": entry["ms"],
               "measured_memory_bytes": entry.get("memory", {}), "tied": entry.get("tied", []),
               "rejected": entry.get("rejected", {}),
               "unmeasured_segments": entry.get("unmeasured", 0),
               "segments": entry.get("segments", []), "segment_sums": segment_sums(entry.get("segments", []))} | \
        ({"measured_ms_by_size": entry["ms_by_size"]} if "ms_by_size" in entry else {}) | \
        ({"decision_by_size": _fastest_by_size(entry, prepared.bounds, ranges)} if served else {})
    return frontend.Partitioning(installed, dict(config.backend_overrides), chosen,
                                 export() if choice.endswith(EXPORT) else None, served), summary


def by_size(entry: dict, bounds: dict[str, int], among: set[str]) -> list[tuple[str, int, int]]:
    """The candidate (of ``among``) that runs each range of sizes of a dynamic model, in order:
    (name, low, high), the sizes whose work (the product of the dynamic dims) is in [low, high).
    Each measured size goes to its fastest candidate unless the fastest over all sizes is within
    ``SPLIT`` of it there; the boundary between two sizes lies at the geometric mean of their work."""
    timed = sorted(sizes(bounds), key=work)
    overall = min(among, key=entry["ms"].get)
    fastest = []
    for dims in timed:
        ms = {name: t for name, t in entry["ms_by_size"][size_label(dims)].items() if name in among}
        best = min(ms, key=ms.get)
        fastest.append(best if ms[overall] > SPLIT * ms[best] else overall)
    ranges: list[tuple[str, int, int]] = []
    for k, name in enumerate(fastest):
        high = math.prod(bounds.values()) + 1 if k == len(timed) - 1 else \
            math.ceil(math.sqrt(work(timed[k]) * work(timed[k + 1])))
        if ranges and ranges[-1][0] == name:
            ranges[-1] = (name, ranges[-1][1], high)
        else:
            ranges.append((name, ranges[-1][2] if ranges else 1, high))
    return ranges


def work(dims: dict[str, int] | None) -> int:
    """A size's work as ``by_size`` orders sizes: the product of its dynamic dims."""
    return math.prod((dims or {}).values())


def _fastest_by_size(entry: dict, bounds: dict[str, int], ranges: list[tuple[str, int, int]]) -> dict[str, str]:
    """Which candidate runs each measured size (``report()["backends"]["decision_by_size"]``)."""
    return {size_label(dims): next(name for name, low, high in ranges if low <= work(dims) < high)
            for dims in sizes(bounds)}


def decide(entry: dict, strategy: str, among: set[str] | None = None) -> str:
    """The candidate a measurement picks under ``strategy`` (among ``among``, default all timed):
    the fastest, or (``memory``) the fastest of those within ``SAME_MEMORY`` of the smallest. A
    mixed plan the rounds could not tell from the next fastest (``tied``) yields to it: one runtime,
    no crossings (Swin-T's mix timed 0.99x OpenVINO alone while compiling, then 1.06x it)."""
    ms = {name: t for name, t in entry["ms"].items() if among is None or name in among}
    if strategy == "memory":
        memory = entry["memory"]
        least = min(memory[name] for name in ms)
        ms = {name: t for name, t in ms.items() if memory[name] <= SAME_MEMORY * least}
    fastest = min(ms, key=ms.get)
    tied = entry.get("tied", [])
    other = [name for name in tied if name != fastest and name in ms]
    return other[0] if fastest == "plan" and fastest in tied and other else fastest


def segment_sums(segments: list[dict]) -> dict[str, float]:
    """The measured segments' summed milliseconds per backend that ran them all, and of the
    cheapest backend of each (``mix``, crossings not counted): what a mixed plan could save. A
    segment not measured within the budget has no times."""
    measured = [segment["ms"] for segment in segments if segment["ms"]]
    if not measured:
        return {}
    everywhere = set.intersection(*(set(ms) for ms in measured))
    sums = {name: sum(ms[name] for ms in measured) for name in sorted(everywhere)}
    return sums | {"mix": sum(min(ms.values()) for ms in measured)}


def _chosen(entry: dict, choice: str, count: int) -> dict[int, str]:
    if choice == "plan":
        return {i: backend for (start, stop, backend) in entry["plan"] for i in range(start, stop)}
    return {} if choice == partition.RELAXC else {i: choice.removesuffix(EXPORT) for i in range(count)}


def structure_key(prepared: frontend.Prepared) -> str:
    """The model's structure and shapes, not its weights' values (the backends' versions are in
    the entry: a decision replays only onto the versions it measured)."""
    digest = hashlib.sha256()
    if prepared.bounds:  # a dynamic model is timed at sizes its bounds decide (``sizes``)
        digest.update(f"bounds {sorted(prepared.bounds.items())};".encode())
    number: dict[str, int] = {}
    for name, shape, dtype in prepared.inputs:
        number[name] = len(number)
        digest.update(f"in {shape} {dtype};".encode())
    for tensor in prepared.proto.graph.initializer:
        number[tensor.name] = len(number)
        digest.update(f"w {list(tensor.dims)} {tensor.data_type};".encode())
    for node in prepared.proto.graph.node:
        attrs = onnx.NodeProto(attribute=node.attribute).SerializeToString()
        reads = [number.get(name, -1) for name in node.input]
        for name in node.output:
            number[name] = len(number)
        digest.update(f"{node.domain}::{node.op_type} {reads};".encode() + attrs)
    return digest.hexdigest()[:32]


def whole_model(prepared: frontend.Prepared, given: frontend.Partitioning,
                err: Exception) -> frontend.Partitioning | None:
    """The whole model on the first external backend, where TVM's importer failed on relaxc's part
    (a form it cannot convert, an output shape it cannot make static) and one is installed; None
    otherwise: a failure in a later phase is relaxc's to fix, never hidden, and a measured
    partition is compiled as it is or not at all."""
    first = next(iter(given.external), None)
    if first is None or not isinstance(err, (ImportFailure, DynamicOutputError)) or given.chosen:
        return None
    log.warning("TVM's importer cannot convert %s (%s); %s runs the whole model", prepared.name,
                message(err), first)
    chosen = {index: first for index in range(len(prepared.proto.graph.node))}
    return frontend.Partitioning(given.external, given.overrides, chosen)


def describe(imported: frontend.ImportedModel, given: frontend.Partitioning, config: Config) -> dict:
    """``report()["backends"]``: the mode, the installed backends with their versions, and each
    external subgraph (backend, where it runs, ops, boundary bytes, why)."""
    used = sorted({sub.backend for sub in imported.subgraphs})
    return {
        "mode": config.backends,
        "installed": list(given.external),
        "versions": {name: external.get(name).version() for name in used},
        "overrides": dict(given.overrides),
        "subgraphs": [{"backend": sub.backend, "placement": _placement(sub),
                       **({"serves": list(sub.serves)} if sub.serves else {}),
                       "function": sub.function, "nodes": len(sub.nodes), "ops": sub.ops,
                       "inputs": sub.inputs, "outputs": [name for name, _, _ in sub.outputs],
                       "boundary_bytes": sub.boundary_bytes(),
                       "why": sub.why or ("measured smaller" if config.strategy == "memory" else "measured faster")}
                      for sub in imported.subgraphs],
    }


def _placement(sub: partition.Subgraph) -> str:
    """Where the subgraph runs: a call in relaxc's program, the tail after it, or the whole model
    instead of it at some sizes."""
    return "sizes" if sub.serves else "tail" if sub.tail else "call"
