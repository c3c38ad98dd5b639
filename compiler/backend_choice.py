"""Which backend runs each part of a model: relaxc's own kernels, or an installed external library.

Modes (``Options.backends``, the modes of every measured decision: ``schedules/decisions.py``):
``off`` uses relaxc's kernels only; ``rule`` sends to the first installed external backend that
runs their operators (onnxruntime, then OpenVINO) exactly the nodes relaxc cannot compile, and the
whole model where TVM fails on relaxc's part; ``replay`` does the same and applies the partition
measured for this model on this CPU before (the ``backends`` decisions of the target's store);
``measure`` measures it first where there is none.

Measuring: the whole model on relaxc (with the fallback) and on each installed backend alone; the
graph cut into segments where fewest values cross, each segment timed on each backend on the
values the model really makes there; the cheapest assignment of segments to backends (a shortest
path along the segments); that plan compiled and timed against the single-backend ones, in
alternating blocks. Segments not measured within ``measure_budget_s`` stay on relaxc. A model
with dynamic dims is measured whole only (a cut inside relaxc's program needs static shapes at
it), at a quarter and a sixteenth of its bounds, each candidate's times there in a geometric mean;
where another candidate is faster by more than ``SPLIT`` at one size, it runs the sizes near that one
(``by_size``). Each
candidate's memory is measured too: the resident memory the process gives back when it is freed
after the timing (garbage collected and freed heap returned to the OS before each reading), so what
a library or TVM sets up once per process is charged to none. The strategy (``Options.strategy``)
picks: ``latency`` the fastest, ``memory`` the smallest (those within ``SAME_MEMORY`` of it: the
fastest). A measurement is keyed by the model's structure and shapes (not its weights) and the
strategy (under ``memory`` relaxc's convolutions are other builds), with the backends' versions.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import hashlib
import logging
import math
import time
from typing import Any, Callable

import numpy as np
import onnx
import psutil
from tqdm import tqdm

from relaxc import external, frontend
from relaxc.frontend import exactness, partition
from relaxc.options import Config
from relaxc.profile import time_call
from relaxc.runtime import Runner, random_inputs
from relaxc.schedules.cache import store_for
from relaxc.schedules.decisions import DecisionStore
from relaxc.support import tvm_log
from relaxc.support.errors import DynamicOutputError, ImportFailure, UserError
from relaxc.support.threads import pool_threads
from relaxc.support.turns import block, paired, paired_times, ratio_range, round_medians

log = logging.getLogger("relaxc")

SEGMENTS = 8  # units of the graph measured per backend
CROSSING_MS = 0.01  # a boundary between backends: one call into the library, no copies
BLOCK_SECONDS = 0.05  # one timed block of a segment's runs
COMPARE_SECONDS = 0.4  # timed runs of each whole-model candidate, at least
SLOWER = 2.0  # a whole-model candidate this much slower than the fastest in one run is not timed further
# candidates within this of the fastest after the first rounds are timed again, longer: six short
# rounds put ResNet-18's relaxc build at 1.17x OpenVINO's and MobileViT-XS's at 1.22x, which
# then timed 0.78x and 0.90x of it over 24 rounds
CLOSE = 1.5
AGREE_RTOL, AGREE_ATOL = 1e-3, 1e-4  # a candidate answers as relaxc does within the project's float32 tolerance
CLOSE_ROUNDS = 24  # rounds of that second comparison, one block of at least BLOCK_SECONDS each
# the two fastest then take CLOSE_ROUNDS more, up to MORE_ROUNDS times, while the range of their
# ratio (``support.turns.ratio_range``) holds 1 and reaches past TIE: over 24 rounds Res2Net-50 timed
# onnxruntime 0.2 % ahead of OpenVINO, which then ran 1.07x (1.05-1.12) ahead of it
TIE, MORE_ROUNDS = 1.03, 3

# a dynamic model is timed with each dim at these fractions of its bound: a bound is the most an
# artifact accepts, served sizes are mostly below it, and BERT at its (16, 384) takes 0.6 s a run
FRACTIONS = (4, 16)
SAME_MEMORY = 1.05  # candidates within this of the smallest count as equally small: resident memory is noisy
# a dynamic model's sizes go to another backend than the fastest overall only where it is this much
# faster there: each backend serving some sizes is one more build held (BERT at batch 4, sequence 96
# ran 1.09x OpenVINO on relaxc's kernels, which are the fastest at a sixteenth of its bounds)
SPLIT = 1.02


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (freed heap handed back to the OS), None where there is none."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c")), "malloc_trim", None)
    except OSError:
        return None


_TRIM = _malloc_trim()

Build = Callable[[frontend.Prepared, frontend.Partitioning], Runner]
EXPORT = "@export"  # a backend's name so marked: it runs the model as exported, not as relaxc prepared it


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
    store = DecisionStore(store_for(config.cache_dir, config.target), "backends", strict=config.tuning == "strict")
    key = structure_key(prepared) + ("" if config.strategy == "latency" else f"-{config.strategy}")
    entry = store.load().get(key)
    if entry is None and config.backends != "measure":  # the libraries are imported only when a plan uses them
        store.missing(f"{prepared.name} ({key})", "compile once with backends='measure' on this CPU, or choose by "
                      "the rule: backends='rule'")
        return base, {"decision": "none stored for this model and CPU (compile with backends='measure')"}
    versions = {name: external.get(name).version() for name in installed}
    if config.backends == "measure" and (entry is None or entry["versions"] != versions):
        entry = measure(prepared, base, config.measure_budget_s, build, export) | {"versions": versions}
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


def measure(prepared: frontend.Prepared, base: frontend.Partitioning, budget_s: float, build: Build,
            export: Callable[[], bytes]) -> dict:
    """Measure the partitions of ``prepared`` (see the module docstring); the store's entry."""
    deadline = time.monotonic() + budget_s
    count = len(prepared.proto.graph.node)
    backends = list(base.external)
    exported = export()
    whole = {partition.RELAXC: base}
    for name in backends:
        everything = {i: name for i in range(count)}
        whole[name] = frontend.Partitioning(base.external, base.overrides, everything)
        whole[name + EXPORT] = frontend.Partitioning(base.external, base.overrides, everything, exported)
    facts = exactness.Facts(prepared.proto, prepared.inputs, list(prepared.proto.graph.node))
    # a cut inside relaxc's program needs static shapes at it: a dynamic model is measured whole only
    parts = [] if prepared.bounds else partition.segments(prepared.proto, SEGMENTS)
    steps = len(whole) + len(parts) * (len(backends) + 1) + 1
    with tqdm(total=steps, desc="[relaxc] measure backends", unit="build", file=tvm_log.console(),
              dynamic_ncols=True) as bar:
        high = frontend.models.input_high(prepared.proto)
        timed_at = sizes(prepared.bounds)
        inputs = [random_inputs(prepared.inputs, high=high, dims=dims) for dims in timed_at]
        built = Built(inputs[0])
        for name, given in whole.items():
            built.add(name, build, prepared, given)
            bar.update()
        if not built.runners:
            raise UserError(f"no backend compiles {prepared.name}: "
                            + "; ".join(f"{name}: {why}" for name, why in built.rejected.items()))
        values = _values(prepared, facts, parts, inputs[0], backends[0]) if parts else {}
        costs, unmeasured = [], 0
        for nodes in parts:
            if time.monotonic() > deadline:
                costs.append({})  # no times: relaxc's kernels run it
                unmeasured += 1
                bar.update(len(backends) + 1)
                continue
            costs.append(_segment_costs(prepared, facts, nodes, [partition.RELAXC, *backends], values, build, bar))
        plan = _shortest(parts, [c or {partition.RELAXC: 0.0} for c in costs]) if parts else []
        if len({backend for _, _, backend in plan}) > 1:
            chosen = {i: backend for start, stop, backend in plan for i in range(start, stop)}
            built.add("plan", build, prepared, frontend.Partitioning(base.external, base.overrides, chosen))
        bar.update()
    compared = [_compare(built.runners, at) for at in inputs]
    by_size = {size_label(dims): times for dims, (times, _) in zip(timed_at, compared)}
    ms = _geometric_mean(list(by_size.values()))
    memory = built.released()
    log.info("backends for %s: %s", prepared.name, ", ".join(
        f"{n} {t:.3f} ms {memory[n] / 2**20:.1f} MiB" for n, t in ms.items()))
    # a dynamic model, timed at two sizes, has no mixed plan to yield
    entry = {"ms": ms, "memory": memory, "tied": compared[0][1] if len(compared) == 1 else []}
    # "choice" is what relaxc before the strategies read from a shared store
    return entry | {"choice": decide(entry, "latency"), "plan": plan, "unmeasured": unmeasured,
                    "rejected": built.rejected,
                    "segments": [{"nodes": [nodes[0], nodes[-1] + 1], "ms": c} for nodes, c in zip(parts, costs)]} | \
        ({"ms_by_size": by_size} if prepared.bounds else {})


def sizes(bounds: dict[str, int]) -> list[dict[str, int] | None]:
    """The sizes a model is timed at: its static shapes, or (``bounds``: its dynamic dims' largest
    sizes) each dim at each of ``FRACTIONS`` of its bound (at least 1), one choice serving them all."""
    if not bounds:
        return [None]
    every = [{dim: max(1, bound // fraction) for dim, bound in bounds.items()} for fraction in FRACTIONS]
    return [dims for k, dims in enumerate(every) if dims not in every[:k]]


def size_label(dims: dict[str, int] | None) -> str:
    """``dims`` as a report and the benchmarks name them: "batch 4, sequence 96"."""
    return ", ".join(f"{dim} {size}" for dim, size in dims.items()) if dims else "static"


def _geometric_mean(timings: list[dict[str, float]]) -> dict[str, float]:
    """Each candidate's geometric mean over ``timings`` (one per size, each timing every candidate):
    the least is the candidate of least mean ratio to the others, whatever each size's scale."""
    return {name: round(math.exp(sum(math.log(t[name]) for t in timings) / len(timings)), 3) for name in timings[0]}


def _differs(outputs: list[np.ndarray], reference: list[np.ndarray]) -> int | None:
    """The first output that differs from ``reference``'s beyond the project's float32 tolerance
    (or in shape), None if none does."""
    for index, (got, want) in enumerate(zip(outputs, reference)):
        atol = AGREE_ATOL * max(1.0, float(np.abs(want).max(initial=0.0)))
        if got.shape != want.shape or not np.allclose(got, want, rtol=AGREE_RTOL, atol=atol, equal_nan=True):
            return index
    return None


class Built:
    """The candidates built and run once on ``inputs``, and why others are none: a build that
    fails, or outputs that differ from the first candidate's (relaxc's kernels with the fallback;
    SSDlite with random weights gets other boxes from OpenVINO than from onnxruntime)."""

    def __init__(self, inputs: dict[str, np.ndarray]) -> None:
        self.inputs = inputs
        self.runners: dict[str, Runner] = {}
        self.rejected: dict[str, str] = {}
        self._reference: tuple[str, list[np.ndarray]] | None = None

    def add(self, name: str, build: Build, prepared: frontend.Prepared, given: frontend.Partitioning) -> None:
        """Build and run the candidate ``name``, or say why it is none: a partition relaxc cannot
        compile (TVM failing on a cut its importer never sees whole) ends this candidate only."""
        try:
            runner = build(prepared, given)
            outputs = [np.array(out) for out in runner.run(self.inputs)]  # arenas and buffers exist after it
        except Exception as err:  # noqa: BLE001 - any failure drops this candidate only, named in the report
            lines = str(err).strip().splitlines()
            self._reject(name, f"not built: {type(err).__name__}: {lines[0] if lines else ''}")
            return
        if self._reference is None:
            self._reference = (name, outputs)
        elif (index := _differs(outputs, self._reference[1])) is not None:
            self._reject(name, f"its output {index} differs from {self._reference[0]}'s")
            return
        self.runners[name] = runner

    def _reject(self, name: str, why: str) -> None:
        self.rejected[name] = why
        log.warning("%s is no candidate for this model: %s", name, why)

    def released(self) -> dict[str, int]:
        """Free the candidates one by one: the resident bytes each gave back (all of them freed)."""
        memory = {}
        before = resident_bytes()
        for name in list(self.runners):
            del self.runners[name]
            after = resident_bytes()
            memory[name], before = max(0, before - after), after
        return memory


def resident_bytes() -> int:
    """The process's resident memory, after collecting garbage and handing freed heap back to the
    OS (glibc's ``malloc_trim``, where there is one): what the live objects hold."""
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)
    return psutil.Process().memory_info().rss


def _values(prepared: frontend.Prepared, facts: exactness.Facts, parts: list[list[int]],
            inputs: dict[str, np.ndarray], backend: str) -> dict[str, np.ndarray]:
    """The values the model makes at the segments' boundaries, on ``inputs`` (run by ``backend``)."""
    names = [name for nodes in parts for name in partition.part(prepared.proto, facts, nodes, backend).inputs]
    probe = partition.with_outputs(prepared.proto, facts, names)
    session = external.get(backend).session(probe.SerializeToString(), 1)
    outputs = [value.name for value in probe.graph.output]
    made = session.run([inputs[name] for name, _, _ in prepared.inputs])
    return {**inputs, **dict(zip(outputs, made))}


def _segment_costs(prepared: frontend.Prepared, facts: exactness.Facts, nodes: list[int], backends: list[str],
                   values: dict[str, np.ndarray], build: Build, bar: Any) -> dict[str, float]:
    """Milliseconds of the segment on each backend that runs it (relaxc: compiled alone)."""
    costs = {}
    sub = partition.part(prepared.proto, facts, nodes, partition.RELAXC,
                         {name: tuple(array.shape) for name, array in values.items()})
    arrays = [values[name] for name in sub.inputs]
    for backend in backends:
        try:
            if backend == partition.RELAXC:
                specs = [(name, tuple(a.shape), str(a.dtype)) for name, a in zip(sub.inputs, arrays)]
                runner = build(frontend.Prepared(onnx.load_from_string(sub.model), "segment", {}, specs),
                               frontend.Partitioning())
                costs[backend] = time_call(lambda: runner.run(*arrays), BLOCK_SECONDS) * 1e3
            else:
                session = external.get(backend).session(sub.model, pool_threads())
                costs[backend] = time_call(lambda: session.run(arrays), BLOCK_SECONDS) * 1e3
        except Exception as err:  # noqa: BLE001 - a backend that cannot run it is no candidate
            log.info("segment %d-%d not on %s: %s", nodes[0], nodes[-1], backend, err)
        bar.update()
    return costs


def _shortest(parts: list[list[int]], costs: list[dict[str, float]]) -> list[tuple[int, int, str]]:
    """The backend of each segment that minimises the summed times plus each crossing's cost."""
    best: dict[str, tuple[float, list[str]]] = {name: (ms, [name]) for name, ms in costs[0].items()}
    for segment in costs[1:]:
        best = {name: min(((total + ms + (CROSSING_MS if path[-1] != name else 0.0), path + [name])
                           for total, path in best.values()), key=lambda item: item[0])
                for name, ms in segment.items()}
    path = min(best.values(), key=lambda item: item[0])[1]
    return [(nodes[0], nodes[-1] + 1, backend) for nodes, backend in zip(parts, path)]


def _compare(runners: dict[str, Runner], inputs: dict[str, np.ndarray],
             repeat: int = 20) -> tuple[dict[str, float], list[str]]:
    """Milliseconds of each runner, and the two fastest where their rounds could not tell which is
    faster (``spread`` holding 1; else no names). The runners take turns in blocks of runs (after
    a pause, so the threads of the one before are idle), each block against the fastest's in its round
    (``support.turns.paired``), rounded to microseconds: at least ``repeat`` runs each, and
    enough to last ``COMPARE_SECONDS``. A runner whose faster of two first runs takes over ``SLOWER``
    times the fastest's keeps that time: a cliff in one kernel costs two runs of it (one alone was
    a burst's, now and then, and dropped a library as fast as the fastest). Those within
    ``CLOSE`` of the fastest then take ``CLOSE_ROUNDS`` more rounds, which decide: on a shared VM
    whose blocks move up to 30 % at random, two builds of one program measured 1.01x apart over
    30 rounds, and choices made over 6 picked builds that then timed 1.1-1.3x the fastest. The
    two fastest take more rounds while that does not settle them (``settled``)."""
    calls = {name: (lambda runner=runner: runner.run(inputs)) for name, runner in runners.items()}
    first = {name: min(block(call, 2)) for name, call in calls.items()}
    fastest = min(first.values())
    runs = max(repeat, int(COMPARE_SECONDS * 1e3 / fastest))
    timed = sorted((name for name in calls if first[name] <= SLOWER * fastest), key=first.get)
    ms = first | paired({name: calls[name] for name in timed}, runs)
    best = min(ms[name] for name in timed)
    close = sorted((name for name in timed if ms[name] <= CLOSE * best), key=ms.get)
    tied: list[str] = []
    if len(close) > 1:
        per_block = max(1, math.ceil(BLOCK_SECONDS * 1e3 / ms[close[0]]))
        medians = round_medians({name: calls[name] for name in close}, CLOSE_ROUNDS * per_block, CLOSE_ROUNDS)
        ms |= paired_times(medians)
        top = {name: calls[name] for name in sorted(close, key=ms.get)[:2]}
        medians = {name: medians[name] for name in top}
        for _ in range(MORE_ROUNDS):
            if settled(medians):
                break
            more = round_medians(top, CLOSE_ROUNDS * per_block, CLOSE_ROUNDS)
            medians = {name: medians[name] + more[name] for name in top}
            ms |= paired_times(medians)
        low, high = spread(medians)
        tied = list(top) if low < 1 < high else []
    return {name: round(value, 3) for name, value in ms.items()}, tied


def settled(medians: dict[str, list[float]]) -> bool:
    """Whether the rounds (two runtimes' block medians, ``support.turns.round_medians``) tell which
    is faster, or that they are within ``TIE`` of each other either way (95 % ranges)."""
    low, high = spread(medians)
    return low >= 1 or high <= 1 or (low >= 1 / TIE and high <= TIE)


def spread(medians: dict[str, list[float]]) -> tuple[float, float]:
    """The 95 % range of the second runtime's rounds against the first's (``support.turns.ratio_range``)."""
    first, second = medians
    return ratio_range(medians, second, first)


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
                str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__, first)
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
