"""Each kernel's schedule chosen by its time inside the model's sequence (``relaxc tune --selection sequence``).

Why: the selection of ``schedules/selection.py`` times a kernel alone, its weights flushed and its
input hot, and that misjudges some kernels by a lot. In ResNet-50 the selected record of the
256 -> 64 convolution at 56x56 took 0.49 ms alone and 0.74 ms in the model, where the default
schedule took 0.47: what the kernels before it leave in the caches, and on which
core, is not what a flush leaves.

How: the model runs call by call on the VM's own arguments (``compiler.profile.model_calls``), and
in every inference each kernel being selected runs one of its candidates (the default, its best
records, the current choice), each kernel going through its candidates in a shuffled order of its
own; a kernel's time per inference is the sum of its calls. So every candidate is timed after its
real predecessors, which run their own candidates in turn: a neighbour's choice counts as noise
shared by all of a kernel's candidates, not as a bias. What a candidate does to the time of the
kernels after it is not counted. Each candidate's output is checked against the current
schedule's first. The current choice stays unless another candidate is faster by more than the
selection's tolerance (ties would otherwise flip with the noise, run to run). The choices go to
the store's ``selected.json`` as the other selection's do, so replay needs nothing new; a kernel
shared by several models keeps the choice of the last model selected. A kernel whose choice stays,
already measured in sequence for the same model, keeps its entry as it was (a selection run then
rewrites only what it changed, not every entry's times).
"""

from __future__ import annotations

import collections
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import tirx
from tvm.target import Target
from tqdm import tqdm

from relaxc.passes.memory import accepting_offsets
from relaxc.schedules import builder
from relaxc.schedules.cache import RecordStore, workload_hash
from relaxc.schedules.selection import TOLERANCE, Candidate, Recorded, candidates, choose, from_record, recorded
from relaxc.support import tvm_internals, tvm_log
from relaxc.support.errors import message

log = logging.getLogger("relaxc")
SELECTIONS = ("alone", "sequence")  # relaxc.TuneOptions.selection: selection.py or this module
TOP_K = 4  # best records (by their tuning measurement) per kernel, beside the default and the current choice
RUNS = 50  # inferences per candidate (each kernel then takes about 1 s of an inference's time per candidate)
RTOL = 1e-3  # a candidate's outputs against the current schedule's (reductions reordered: rounding only)


@dataclass
class Kernel:
    """One kernel being selected: its candidates, built, and the model's calls of it."""

    name: str
    key: str  # workload hash
    records: int
    calls: list[int]  # positions in the model's calls
    candidates: list[Candidate]
    functions: list[Any]
    current: int  # the candidate replay runs now


def select_in_sequence(calls: list[tuple[str, Any, list[Any]]], kernels: dict[str, tirx.PrimFunc],
                       store: RecordStore, target: Target, wanted: set[str] | None = None,
                       runs: int = RUNS, model: str = "") -> dict:
    """Choose the schedule of every kernel in ``kernels`` (by symbol; those named in ``wanted``, if
    given) that has records, by timing its candidates in ``calls`` (one inference, as
    ``compiler.profile.model_calls`` gives them); saves the choices in ``store`` and returns a
    summary: per kernel, the time of each candidate in sequence, the choice and the one before."""
    if target.kind.name != "llvm":
        return {"selected": 0, "skipped": "selection measures on the CPU; GPU kernels keep their best record"}
    positions: dict[str, list[int]] = collections.defaultdict(list)
    for i, (symbol, _, _) in enumerate(calls):
        if symbol in kernels and (wanted is None or symbol in wanted):
            positions[symbol].append(i)
    modules = {symbol: tvm_internals.kernel_module(kernels[symbol]) for symbol in positions}
    hashes = {workload_hash(mod): symbol for symbol, mod in modules.items()}
    lines = store.records_of(hashes)
    chosen = store.selections()
    selected = []
    for key, symbol in tqdm([(k, s) for k, s in hashes.items() if lines.get(k)], desc="[relaxc] build candidates",
                            unit="kernel", file=tvm_log.console(), dynamic_ncols=True):
        kernel = _kernel(symbol, key, modules[symbol], lines[key], chosen.get(key), positions[symbol], target,
                         recorded(store, key))
        _drop_wrong(kernel, calls)
        if len(kernel.candidates) > 1:
            selected.append(kernel)
    _time(selected, calls, runs)
    entries, summary = {}, {}
    measured = f"in sequence, {model}".rstrip(", ")
    for kernel in selected:
        before = kernel.candidates[kernel.current]
        fastest = min(c.ms for c in kernel.candidates)
        # a choice changes only for a measurable difference: the current one within the tolerance stays
        winner = before if before.ms <= fastest * (1 + TOLERANCE) else choose(kernel.candidates)
        default = next((c for c in kernel.candidates if c.record is None), None)
        summary[kernel.name] = {"key": kernel.key, "choice": winner.label, "before": before.label,
                                "ms": round(winner.ms, 4),
                                "before_ms": round(before.ms, 4),
                                "candidates_ms": {c.label: round(c.ms, 4) for c in kernel.candidates}}
        log.debug("select in sequence %s: %s %.3f ms (was %s %.3f ms)", kernel.name, winner.label, winner.ms,
                  before.label, before.ms)
        if winner is before and chosen.get(kernel.key, {}).get("measured") == measured:
            continue  # the same choice, measured the same way: its entry stays as it was (no churn in the store)
        entries[kernel.key] = {
            "task": kernel.name, "choice": winner.label, "ms": round(winner.ms, 4), "build_s": round(winner.build_s, 3),
            "record": winner.record and [winner.record[0], [winner.ms / 1e3], *winner.record[2:]],
            "default_ms": default and round(default.ms, 4), "default_build_s": default and round(default.build_s, 3),
            "fastest_ms": round(fastest, 4), "candidates": len(kernel.candidates),
            "records": kernel.records, "tolerance": TOLERANCE, "measured": measured,
            "selected_on": time.strftime("%Y-%m-%d %H:%M:%S")}
    with store.lock():
        store.save_selections(entries)
    return {"selected": len(summary), "rewritten": len(entries), "runs_per_candidate": runs,
            "changed": sorted(name for name, s in summary.items() if s["choice"] != s["before"]),
            "sum_ms": round(sum(s["ms"] for s in summary.values()), 3),
            "sum_before_ms": round(sum(s["before_ms"] for s in summary.values()), 3), "kernels": summary}


def _kernel(symbol: str, key: str, mod: tvm.IRModule, lines: list[str], chosen: dict | None, calls: list[int],
            target: Target, workload: Recorded) -> Kernel:
    """The candidates of one kernel, built as the model calls them (parameters at arena offsets;
    ``workload``: see ``selection.apply_trace``)."""
    found = candidates(mod, lines, target, TOP_K, workload)
    traces = [json.dumps(c.record[0]) if c.record else None for c in found]
    if chosen is None:  # replay runs the fastest record of its tuning
        current = 1 if len(found) > 1 else 0
    elif chosen["choice"] == "default":
        current = 0
    else:
        trace = json.dumps(chosen["record"][0])
        if trace not in traces:  # ranked below the top records by its tuning time
            found.extend(from_record(mod, chosen["record"], f"{chosen['choice']} (chosen before)", workload))
            traces.append(trace)
        current = traces.index(trace)
    functions, built = [], []
    for i, candidate in enumerate(found):
        start = time.perf_counter()
        func = candidate.schedule.mod["main"]
        try:
            lib = builder.build(tvm.IRModule({"main": accepting_offsets(func)}), target, None)
            functions.append(lib["main"])  # LLVM generates the machine code when a function is first looked up
        except Exception as err:  # noqa: BLE001 - one candidate failing to build drops that candidate only
            log.warning("%s of %s does not build (%s); dropped", candidate.label, symbol, message(err))
            if i == current:
                raise
            continue
        candidate.build_s = time.perf_counter() - start
        built.append(candidate)
    current = built.index(found[current])
    return Kernel(symbol, key, len(lines), calls, built, functions, current)


def _drop_wrong(kernel: Kernel, calls: list[tuple[str, Any, list[Any]]]) -> None:
    """Drop the candidates whose outputs at the kernel's first call differ from the current
    schedule's (each candidate runs after the model's kernels before it, run again: a kernel may
    write in place)."""
    first = kernel.calls[0]
    before = [(callee, args) for symbol, callee, args in calls[:first] if not is_builtin(symbol)]
    outputs = []
    for function in kernel.functions:
        for callee, args in before:
            callee(*args)
        args = calls[first][2]
        function(*args)
        outputs.append([a.numpy() for a in args if isinstance(a, tvm.runtime.Tensor)])
    expected = outputs[kernel.current]
    keep = [i for i, got in enumerate(outputs)
            if all(np.allclose(g, e, rtol=RTOL, atol=RTOL * (np.abs(e).max() + 1e-30)) for g, e in zip(got, expected))]
    for i in sorted(set(range(len(outputs))) - set(keep)):
        log.warning("%s of %s: outputs differ from the current schedule's; dropped", kernel.candidates[i].label,
                    kernel.name)
    current = kernel.candidates[kernel.current]
    kernel.candidates = [kernel.candidates[i] for i in keep]
    kernel.functions = [kernel.functions[i] for i in keep]
    kernel.current = kernel.candidates.index(current)


def _time(kernels: list[Kernel], calls: list[tuple[str, Any, list[Any]]], runs: int) -> None:
    """Inferences in which each kernel runs its candidates in turns (shuffled, per kernel), until
    every candidate has at least ``runs`` times; a kernel's time in one inference is the sum of its
    calls. First, not counted, inferences that run every candidate once (page faults of new code)."""
    by_call = {i: kernel for kernel in kernels for i in kernel.calls}
    sequence = [(by_call.get(i), callee, args) for i, (symbol, callee, args) in enumerate(calls)
                if not is_builtin(symbol)]
    most = max((len(k.candidates) for k in kernels), default=0)
    for warmup in range(most):
        _infer(sequence, {k.name: warmup % len(k.candidates) for k in kernels})
    rng = np.random.default_rng(0)
    turns: dict[str, list[int]] = {kernel.name: [] for kernel in kernels}
    for _ in tqdm(range(runs * most), desc="[relaxc] time in sequence", unit="inference", file=tvm_log.console(),
                  dynamic_ncols=True):
        choice = {}
        for kernel in kernels:
            if not turns[kernel.name]:
                turns[kernel.name] = rng.permutation(len(kernel.candidates)).tolist()
            choice[kernel.name] = turns[kernel.name].pop()
        spent = _infer(sequence, choice)
        for kernel in kernels:
            kernel.candidates[choice[kernel.name]].runs_ms.append(spent[kernel.name] * 1e3)


def _infer(sequence: list[tuple[Kernel | None, Any, list[Any]]], choice: dict[str, int]) -> dict[str, float]:
    """One inference, each kernel running its candidate ``choice[kernel]``; seconds per kernel."""
    spent: dict[str, float] = collections.defaultdict(float)
    for kernel, callee, args in sequence:
        if kernel is None:
            callee(*args)
            continue
        function = kernel.functions[choice[kernel.name]]
        start = time.perf_counter()
        function(*args)
        spent[kernel.name] += time.perf_counter() - start
    return spent


def is_builtin(symbol: str) -> bool:
    """A VM builtin (allocation, kills): not replayed, each would allocate again."""
    return symbol.startswith("vm.builtin")


def time_in_order(calls: list[tuple[str, Any, list[Any]]], times: dict[int, list[float]], runs: int) -> None:
    """``runs`` inferences' worth of ``calls``, one by one in model order; each call's seconds are
    appended to ``times[its index]``."""
    for _ in range(runs):
        for i, (_, func, args) in enumerate(calls):
            start = time.perf_counter()
            func(*args)
            times[i].append(time.perf_counter() - start)
