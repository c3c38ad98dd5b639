"""Dispatch decisions: each convolution workload's candidates measured once, kept, replayed after.

``passes/dispatch.py`` asks a ``Chooser`` which implementation a convolution gets. The chooser
answers from the ``dispatch`` decisions of the target's store in the cache (``dispatch.json``:
``schedules/decisions.py``), keyed by workload, so a workload is measured once ever per target and every
later compile replays the decision (docs/design.md, "The ideas relaxc is built on"). Modes
(``compile(dispatch=...)``):

- ``measure``: workloads without a stored measurement are measured now and stored;
- ``replay`` (the default): stored decisions; a workload without one gets the rule below, and the
  report and one log line say which and how to measure them; with ``tuning="strict"`` (CI) a
  missing decision is an error, as a missing tuning record is;
- ``off``: the direct convolution everywhere (for comparisons);
- ``rule``: the rule only, the store is not read: Winograd wherever a whole vector of input
  channels feeds it (measured 1.4-3.7x faster than the direct convolution on every ResNet/VGG 3x3
  shape of 14x14 and more), F(4x4, 3x3) where the output is at least 8 a side, F(2x2, 3x3) on
  smaller ones; the direct convolution otherwise, and everywhere under ``strategy="memory"``
  (Winograd's transformed weights and intermediates are larger).

A measurement builds each candidate alone (the convolution with its real weights, the pipeline's
phases from legalisation on, tuning records replayed as in the model), then times the candidates in
turns, each run after flushing the caches (weights are read from memory once per inference in a
model), and compares every candidate's output with the direct convolution's on the same input: a
candidate whose error exceeds ``ERROR_LIMIT`` (relative to the output's largest value) is refused.
Strategies: ``latency`` takes the fastest candidate allowed, ``memory`` the one whose intermediate
tensors are smallest (the direct convolution has none; Winograd's V and M are alpha^2 / m^2 times
the input and output). Under ``latency`` a choice measured in a model's own sequence of calls
(``relaxc tune --selection sequence``: ``schedules/dispatch_sequence.py``, kept in the entry as
``in_sequence``) overrides the times measured alone.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import tvm
from tvm import relax

from relaxc.passes.dispatch import (DIRECT, WINOGRAD, ConvWorkload, Kernels, candidates, emit_winograd, scratch_bytes,
                             tile_size)
from relaxc.schedules.decisions import DecisionStore
from relaxc.support import remote
from relaxc.support.errors import UserError
from relaxc.support.turns import in_turns

log = logging.getLogger("relaxc")
STRATEGIES = ("latency", "memory")
ERROR_LIMIT = 1e-4  # max |candidate - direct| / max |direct|: the project's float32 tolerance
ROUNDS = 3  # the candidates take turns this many times
RUNS_PER_ROUND = 5
_FORCED: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("relaxc_dispatch_forced", default={})


@contextlib.contextmanager
def forcing(choices: dict[str, str]) -> Iterator[None]:
    """Compiles inside get these workloads' candidates (workload key -> candidate), whatever the
    store says: ``schedules/dispatch_sequence.py`` builds the model once per candidate this way."""
    token = _FORCED.set(choices)
    try:
        yield
    finally:
        _FORCED.reset(token)


def rule(workload: ConvWorkload, options: list[str], strategy: str = "latency") -> str:
    """The fixed rule: Winograd when at least a vector of input channels feeds it, F(4x4) where
    the output holds two whole 4x4 tiles a side, F(2x2) below. On 7x7 outputs F(4x4) reads
    weights transformed to 4x their size for 4 tiles: the stores of five CPUs measured it at up
    to 1.7x F(2x2), and F(4x4) everywhere at 1.01-1.14x the fastest candidate on average (66-69
    workloads per CPU) against 1.00-1.04x for this rule. Under ``memory`` the direct convolution,
    whose weights are not transformed and which has no intermediates."""
    if strategy == "memory":
        return DIRECT
    _, outer, height, width, block = workload.data
    top, left, bottom, right = workload.padding
    smaller = min(height + top + bottom, width + left + right) - 2  # the output's shorter side (stride 1)
    tile = 4 if smaller >= 8 and WINOGRAD[4] in options else 2  # a quantized convolution has F(2x2) only
    return WINOGRAD[tile] if WINOGRAD[tile] in options and outer * block >= 16 else DIRECT


def decide(entry: dict, strategy: str) -> str:
    """The candidate a measurement entry picks under ``strategy``, among those accurate enough."""
    allowed = {name: c for name, c in entry["candidates"].items() if c["error"] <= ERROR_LIMIT}
    if strategy == "memory":
        return min(allowed, key=lambda name: (allowed[name]["scratch_bytes"], allowed[name]["ms"]))
    in_sequence = entry.get("in_sequence", {}).get("choice")
    if in_sequence in allowed:
        return in_sequence
    return min(allowed, key=lambda name: allowed[name]["ms"])


Builder = Callable[[tvm.IRModule], relax.VMExecutable]


@dataclass
class Chooser:
    """Answers ``passes/dispatch.py``: which candidate a convolution gets, and how it was chosen."""

    mode: str
    strategy: str
    store: DecisionStore | None  # the "dispatch" decisions (strict or not); None: not read (rule, off)
    build: Builder  # the pipeline from legalisation on, for one candidate's module
    lanes: int
    registers: int

    def __post_init__(self) -> None:
        self.known = self.store.load() if self.store is not None else {}

    def __call__(self, workload: ConvWorkload, options: list[str], call: relax.Call) -> tuple[str, dict]:
        """The candidate for ``workload``, and how it was chosen: ``source`` (forced, measured, stored or
        rule), the measured ``candidates`` (ms, error, scratch bytes) where there are some, and the
        ``in_sequence`` measurement where there is one."""
        if self.mode == "off":
            return DIRECT, {"source": "off"}
        key = workload.key
        forced = _FORCED.get().get(key)
        if forced is not None:
            if forced not in options:
                raise UserError(f"dispatch: {forced} is not a candidate of {key} ({', '.join(options)})")
            return forced, {"source": "forced", "candidates": self.known.get(key, {}).get("candidates", {})}
        entry = self.known.get(key)
        source = "stored"
        current = entry is not None and set(entry["candidates"]) == set(options)  # not from fewer candidates
        if not current and self.mode == "measure":
            entry = self.known[key] = self._measure(workload, options, call)
            source, current = "measured", True
        if not current:
            if self.store is not None:
                self.store.missing(key, "compile once with dispatch='measure' (or run `relaxc tune`) on this CPU, "
                                        "or choose by the rule: dispatch='rule'")
            return rule(workload, options, self.strategy), {"source": "rule"}
        how = {"source": source, "candidates": entry["candidates"]}
        if "in_sequence" in entry:  # decided in a model's sequence: the times that decided it
            how["in_sequence"] = entry["in_sequence"]
        return decide(entry, self.strategy), how

    def _measure(self, workload: ConvWorkload, options: list[str], call: relax.Call) -> dict:
        start = time.perf_counter()
        rng = np.random.default_rng(0)
        x = rng.uniform(-1, 1, workload.data).astype("float32")
        built = {name: self.build(candidate_module(call, name, self.lanes, self.registers))
                 for name in options}

        def timed(bench: remote.Bench) -> tuple[dict[str, np.ndarray], dict[str, float]]:
            vms = {name: relax.VirtualMachine(bench.load(ex), bench.device) for name, ex in built.items()}
            data = tvm.runtime.tensor(x, bench.device)
            outputs = {name: vm["main"](data).numpy() for name, vm in vms.items()}
            return outputs, time_in_turns({name: (vm, data) for name, vm in vms.items()}, bench)

        outputs, ms = remote.on_bench(timed, f"the implementations of {workload.key}")  # this CPU or a server
        reference = outputs[DIRECT].astype(np.float64)
        scale = float(np.abs(reference).max()) or 1.0
        candidates = {name: {"ms": ms[name],
                             "error": float(np.abs(outputs[name] - reference).max() / scale),
                             "scratch_bytes": scratch_bytes(workload, name, self.lanes, self.registers)}
                      for name in options}
        entry = {"candidates": candidates, "measured_on": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "seconds": round(time.perf_counter() - start, 2)}
        if self.store is not None:
            self.store.save(workload.key, entry)
        log.info("dispatch: measured %s in %.1f s: %s", workload.key, entry["seconds"],
                 ", ".join(f"{n} {c['ms']:.3f} ms" for n, c in candidates.items()))  # progress, one per workload
        return entry


def time_in_turns(runs: dict[str, tuple[relax.VirtualMachine, tvm.runtime.Tensor]],
                  bench: remote.Bench) -> dict[str, float]:
    """Median ms of each VM's ``main`` on its input, the VMs taking turns on ``bench``
    (``turns.in_turns``), each run after evicting the caches (weights are read from memory once per
    inference in a model)."""
    def turn(vm: relax.VirtualMachine, data: tvm.runtime.Tensor) -> Callable[[int], list[float]]:
        timer = vm.time_evaluator("main", bench.device, number=1, repeat=1)

        def cold_runs(_round: int) -> list[float]:
            times = []
            for _ in range(RUNS_PER_ROUND):
                bench.evict_caches()
                times.append(timer(data).mean * 1e3)
            return times
        return cold_runs

    timed = in_turns({name: turn(vm, data) for name, (vm, data) in runs.items()}, ROUNDS)
    return {name: round(statistics.median(t for each in rounds for t in each), 4) for name, rounds in timed.items()}


@dataclass
class MeasuredLayoutCosts:
    """``passes/layout_choice.LayoutCosts`` from ``<store>/layouts.json``: each convolution in a
    layout and each converter timed once per target (``measure``), replayed after."""

    measure: bool  # time what is not stored (else: unknown)
    store: DecisionStore | None  # the "layouts" decisions (strict or not)
    build: Builder

    def __post_init__(self) -> None:
        self.known = self.store.load() if self.store is not None else {}
        self.measured = 0

    def ms(self, key: str, module: Callable[[], tvm.IRModule]) -> float | None:
        if key in self.known:
            return self.known[key]["ms"]
        if not self.measure:
            if self.store is not None:
                self.store.missing(key, "compile once with layouts='measure' on this CPU, or choose by the rule: "
                                        "layouts='rule'")
            return None
        start = time.perf_counter()
        module = module()
        shape = [int(d) for d in module["main"].params[0].ty.shape.values]
        built = self.build(module)
        x = np.random.default_rng(0).uniform(-1, 1, shape).astype("float32")

        def timed(bench: remote.Bench) -> float:
            vm = relax.VirtualMachine(bench.load(built), bench.device)
            return time_in_turns({key: (vm, tvm.runtime.tensor(x, bench.device))}, bench)[key]

        ms = remote.on_bench(timed, key)
        entry = {"ms": ms, "measured_on": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "seconds": round(time.perf_counter() - start, 2)}
        self.known[key] = entry
        self.measured += 1
        if self.store is not None:
            self.store.save(key, entry)
        return entry["ms"]


def candidate_module(call: relax.Call, name: str, lanes: int, registers: int) -> tvm.IRModule:
    """A module whose ``main`` runs one candidate of the convolution ``call`` on its input, at the
    batch its workload has (1 for a dynamic one)."""
    bb = relax.BlockBuilder()
    workload, _ = candidates(call)
    x = relax.Var("x", relax.TensorType(list(workload.data), call.args[0].ty.dtype))
    conv = relax.Call(call.op, [x, call.args[1]], call.attrs, call.ty_args)
    with bb.function("main", [x]):
        with bb.dataflow():
            if name == DIRECT:
                out = bb.emit(conv)
            else:
                conv = bb.normalize(conv)  # typed: emit_winograd reads its output shape
                out = bb.emit(emit_winograd(Kernels(bb), conv, workload, tile_size(name), lanes, registers))
            result = bb.emit_output(out)
        bb.emit_func_output(result)
    return bb.get()
