"""The measurement behind the backend choice: the whole-model candidates and the segments of the
graph, each timed on each backend; the cheapest assignment of segments to backends (a shortest path
along the segments) compiled as one more candidate (``compiler/build/backend_choice.py`` says what is
measured and how the plan is chosen; ``compiler/build/backend_candidates.py`` how candidates are timed).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable

import numpy as np
import onnx
from tqdm import tqdm

from relaxc.build import backend_candidates
from relaxc.runtime import external
from relaxc import frontend
from relaxc.build.backend_candidates import BLOCK_SECONDS, EXPORT, Build
from relaxc.frontend import exactness, partition
from relaxc.build.profile import time_call
from relaxc.runtime.runner import random_inputs
from relaxc.support import tvm_log
from relaxc.support.errors import UserError
from relaxc.support.threads import pool_threads

log = logging.getLogger("relaxc")

SEGMENTS = 8  # units of the graph measured per backend
CROSSING_MS = 0.01  # a boundary between backends: one call into the library, no copies
# a dynamic model is timed with each dim at these fractions of its bound: a bound is the most an
# artifact accepts, served sizes are mostly below it, and BERT at its (16, 384) takes 0.6 s a run
FRACTIONS = (4, 16)


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
        built = backend_candidates.Built(inputs[0])
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
    compared = [backend_candidates.compare(built.runners, at) for at in inputs]
    by_size = {size_label(dims): times for dims, (times, _) in zip(timed_at, compared)}
    ms = _geometric_mean(list(by_size.values()))
    memory = built.released()
    log.info("backends for %s: %s", prepared.name, ", ".join(
        f"{n} {t:.3f} ms {memory[n] / 2**20:.1f} MiB" for n, t in ms.items()))
    # a dynamic model, timed at two sizes, has no mixed plan to yield
    entry = {"ms": ms, "memory": memory, "tied": compared[0][1] if len(compared) == 1 else []}
    return entry | {"plan": plan, "unmeasured": unmeasured,
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
