"""Dispatch decisions measured in the model's own sequence of calls (``relaxc tune --selection sequence``).

Why: ``schedules/dispatch.py`` times each convolution's candidates alone, the caches flushed by the
calling thread only. In the model, Winograd's transformed weights (alpha^2 / 9 times the direct
convolution's: 4x for F(4x4), 1.8x for F(2x2)) stream from memory after the kernels before them
have filled the caches, and both cores hold what those kernels left. Alone, ResNet-50's 14x14
convolutions (256 channels) favour F(4x4) (0.58 ms against F(2x2)'s 0.70) and its 7x7 ones (512
channels) F(2x2) (1.41 ms against direct's 1.64); in the model F(2x2) and direct respectively
are faster, by 0.34-0.80 ms per inference together.

How: for each workload with more than one accurate candidate (error within the dispatch's limit),
the model is built once per candidate, that workload fixed to it (``schedules.dispatch.forcing``),
every other as the store decides, tuning records replayed. The builds take turns, one inference
each in a shuffled order per round, every kernel timed in model order on the VM's own arguments.
A candidate's cost is the sum of the per-call medians of the calls to its own kernels: those not
in every build (compared by structure, not by name: fusion numbers kernels differently when one
disappears); the kernels all builds share are left out, so their noise does not decide (a kernel
whose argument sits at another arena offset in each build counts as its own in every one: in
ResNet-50 the input's layout transform and the final reshape, 0.1 ms alike). The
current choice stays unless it is more than ``TOLERANCE`` slower than the fastest. The result goes
into the workload's ``dispatch.json`` entry as ``in_sequence`` (the model, each candidate's ms, the
choice), which replay then follows (``schedules.dispatch.decide``); workloads are decided one after
another, each build reading the decisions made before it. A workload shared by several models
keeps the decision of the last one measured.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tvm_ffi
from tvm import tirx
from tqdm import tqdm

from relaxc.schedules.decisions import DecisionStore
from relaxc.schedules.dispatch import ERROR_LIMIT
from relaxc.schedules.selection import TOLERANCE
from relaxc.schedules.sequence import is_builtin, time_in_order
from relaxc.support import tvm_log

log = logging.getLogger("relaxc")
RUNS = 30  # timed inferences per candidate build
Call = tuple[str, Any, list[Any]]  # compiler.profile.model_calls: symbol, callee, arguments


@dataclass
class Variant:
    """One build of the model: one inference's calls (builtins included) and its kernels by symbol."""

    calls: list[Call]
    kernels: dict[str, tirx.PrimFunc]
    vm: Any = None  # owns the arena the calls' arguments live in: kept alive with them


def contested(convolutions: list[dict]) -> dict[str, tuple[str, list[str]]]:
    """Per workload with more than one accurate measured candidate: its current choice and those
    candidates (from ``report()["dispatch"]["convolutions"]``)."""
    found = {}
    for conv in convolutions:
        allowed = sorted(name for name, c in conv.get("candidates", {}).items() if c["error"] <= ERROR_LIMIT)
        if len(allowed) > 1 and conv["choice"] in allowed:
            found[conv["workload"]] = (conv["choice"], allowed)
    return found


def own_calls(variants: dict[str, Variant]) -> dict[str, list[int]]:
    """Per variant, the positions of its calls to kernels that not every variant has (by structural
    hash); builtins are never counted."""
    hashes = {name: {symbol: tvm_ffi.structural_hash(func.without_attr("global_symbol"))  # names differ by build
                     for symbol, func in v.kernels.items()}
              for name, v in variants.items()}
    common = set.intersection(*(set(h.values()) for h in hashes.values()))
    return {name: [i for i, (symbol, _, _) in enumerate(v.calls)
                   if symbol in hashes[name] and hashes[name][symbol] not in common]
            for name, v in variants.items()}


def time_variants(variants: dict[str, Variant], runs: int = RUNS, seed: int = 0) -> dict[str, float]:
    """Per variant, the ms per inference of its own calls (``own_calls``): the sum of their medians
    over ``runs`` inferences, the variants taking turns (a shuffled order every round), after one
    inference each that is not counted (page faults of new code)."""
    variants = {name: dataclasses.replace(v, calls=[c for c in v.calls if not is_builtin(c[0])])
                for name, v in variants.items()}
    own = own_calls(variants)
    times: dict[str, dict[int, list[float]]] = {name: collections.defaultdict(list) for name in variants}
    for name, variant in variants.items():
        time_in_order(variant.calls, times[name], runs=1)
        times[name].clear()
    rng = np.random.default_rng(seed)
    names = list(variants)
    for _ in tqdm(range(runs), desc="[relaxc] time in sequence", unit="round", file=tvm_log.console(),
                  dynamic_ncols=True, leave=False):
        for k in rng.permutation(len(names)):
            time_in_order(variants[names[k]].calls, times[names[k]], runs=1)
    return {name: round(sum(statistics.median(times[name][i]) for i in own[name]) * 1e3, 4) for name in variants}


def decide_in_sequence(workloads: dict[str, tuple[str, list[str]]], build: Callable[[str, str], Variant],
                       store: DecisionStore, model: str, runs: int = RUNS) -> dict:
    """Decide each workload of ``workloads`` (``contested``) by timing its candidates in the model
    (``build(workload, candidate)`` compiles the model with that candidate fixed); saves each
    decision in ``store`` before building the next workload's variants, and returns a summary."""
    summary = {}
    for key, (current, allowed) in tqdm(workloads.items(), desc="[relaxc] dispatch in sequence", unit="workload",
                                        file=tvm_log.console(), dynamic_ncols=True):
        ms = time_variants({name: build(key, name) for name in allowed}, runs)
        fastest = min(ms.values())
        choice = current if ms[current] <= fastest * (1 + TOLERANCE) else min(ms, key=ms.get)
        entry = store.load()[key]
        entry["in_sequence"] = {"model": model, "ms": ms, "choice": choice, "tolerance": TOLERANCE,
                                "runs": runs, "measured_on": time.strftime("%Y-%m-%d %H:%M:%S")}
        store.save(key, entry)
        summary[key] = {"choice": choice, "before": current, "ms": ms}
        log.info("dispatch in sequence: %s: %s (was %s; %s)", key, choice, current,
                 ", ".join(f"{n} {t:.3f} ms" for n, t in ms.items()))
    return {"workloads": len(summary), "changed": sorted(k for k, s in summary.items() if s["choice"] != s["before"]),
            "decisions": summary}
