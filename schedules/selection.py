"""Each kernel's final schedule: its default and its best tuning records, measured again side by side.

Why a second measurement:
- MetaSchedule keeps every trial's time from whenever it ran, under whatever load the machine had
  then, and the best of a hundred such trials beats one measurement of the default by luck as often
  as by merit (ResNet-50: the records promised 63 ms of kernels against 144 ms for the defaults; the
  model ran in 61.6 ms against 64.9). Here the candidates take turns, in one process.
- MetaSchedule times a kernel again and again on the same buffers, so its weights sit in the cache;
  in the model every weight is read once per inference, from memory. Here every run starts with the
  caches flushed of everything but the kernel's first input (the activation its producer just wrote).
- MetaSchedule's explicit unrolling (up to 512 steps) can make one kernel cost LLVM 5 s to build and
  load, against 0.1 s for the same tiling unrolled 16 steps, often for no speed at all. Each record
  unrolled beyond ``UNROLL_CAP`` is also measured with the cap, build time included, and among the
  candidates within ``TOLERANCE`` of the fastest the cheapest to build wins.

The choices are kept in the store's ``selected.json`` (``schedules/cache.py``): replay applies
them in preference to the raw records.
"""

from __future__ import annotations

import functools
import json
import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Trace
from tvm.target import Target
from tqdm import tqdm

from relaxc.passes.tir import tir_pipeline
from relaxc.schedules.cache import RecordStore, mean_seconds, workload_hash
from relaxc.schedules.default import default_schedule
from relaxc.support import remote, tvm_log
from relaxc.support.errors import message
from relaxc.support.turns import in_turns

log = logging.getLogger("relaxc")
TOLERANCE = 0.03  # within 3% of the fastest counts as as fast: about the noise of these medians here
BUILD_SLACK_S = 0.05  # build times this close count as equal (then the faster kernel wins)
TOP_K = 16  # best records (by their tuning measurement) measured again per kernel
UNROLL_CAP = 16  # records unrolled further are measured with this cap too
ROUNDS = 5  # the candidates take turns this many times
RUNS_PER_ROUND = 8  # cold runs per candidate and turn; the median of all of them counts
UNROLL_ATTR = "pragma_auto_unroll_max_step"

_json_parse = tvm_ffi.get_global_func("ffi.json.Parse")
Recorded = Callable[[], tirx.PrimFunc | None]  # the kernel a record was tuned on, looked up when asked (``recorded``)


@dataclass
class Candidate:
    """One schedule of a kernel: the default (``record`` None) or a tuning record (its JSON)."""

    label: str
    schedule: s_tir.Schedule
    record: list | None = None
    build_s: float = 0.0
    runs_ms: list[float] = field(default_factory=list)

    @property
    def ms(self) -> float:
        return statistics.median(self.runs_ms)


def recorded(store: RecordStore, key: str) -> Recorded:
    """The kernel workload ``key``'s records were tuned on, looked up in ``store`` on the first call
    only (a scan of the store's workload file: ``apply_trace`` needs it only when names differ)."""
    return functools.cache(functools.partial(store.workload, key))


def apply_trace(entry: list, sch: s_tir.Schedule, workload: Recorded | None = None) -> None:
    """Replay a record (its JSON: the second field of a database line) onto ``sch``, a schedule of
    a kernel of the structure it was tuned for.

    Block names follow the model's variable names, which the workload hash ignores: a record tuned
    on one model's kernel serves the same kernel in another model, whose blocks are named otherwise
    (EfficientNet-B0's average pool reduces in ``lv397_red``, MobileNetV2's in ``lv375_red``). Where
    the trace names a block this kernel lacks and ``workload`` (``recorded``) gives the kernel the
    record was tuned on, the trace's block names are mapped to this kernel's, block by block in the
    order both kernels hold them, and so are the names of blocks the trace creates
    (``lv397_red_rf``: ``rfactor`` names its block after the one it splits)."""
    original = workload() if workload is not None and _missing_blocks(entry, sch) else None
    if original is not None:
        names = dict(zip(block_names(s_tir.Schedule(original)), block_names(sch)))
        instructions, *rest = entry[0]
        instructions = [[kind, inputs, [_renamed(attrs[0], names), *attrs[1:]], outputs]
                        if kind == "GetSBlock" else [kind, inputs, attrs, outputs]
                        for kind, inputs, attrs, outputs in instructions]
        entry = [[instructions, *rest], *entry[1:]]
    Trace.apply_json_to_schedule(_json_parse(json.dumps(entry[0])), sch)


def _renamed(name: str, names: dict[str, str]) -> str:
    """``name`` with the longest of ``names`` it starts with replaced by its new name."""
    old = max((n for n in names if name.startswith(n)), key=len, default=None)
    return name if old is None else names[old] + name[len(old):]


def block_names(sch: s_tir.Schedule) -> list[str]:
    """The names of a kernel's blocks, parents before children: kernels of one structure list them alike."""
    names: list[str] = []

    def visit(parent: s_tir.schedule.SBlockRV) -> None:
        for child in sch.get_child_blocks(parent):
            names.append(sch.get(child).name_hint)
            visit(child)

    visit(sch.get_sblock("root"))
    return names


def _missing_blocks(entry: list, sch: s_tir.Schedule) -> bool:
    """Whether the record's trace names a block the kernel of ``sch`` does not have (see ``apply_trace``)."""
    named = {attrs[0] for kind, _, attrs, _ in entry[0][0] if kind == "GetSBlock"}
    return not named <= set(block_names(sch))


def capped_unroll(entry: list, cap: int = UNROLL_CAP) -> list | None:
    """The record with each explicit unroll limited to ``cap`` steps; None if none goes beyond it.

    The unroll limit is a literal of the trace's post-processing (``Annotate(loop, N,
    "pragma_auto_unroll_max_step")``), so the capped trace replays to exactly the capped kernel."""
    (instructions, decisions), *rest = entry
    changed = False
    capped = []
    for inst in instructions:
        kind, inputs, attrs, outputs = inst
        if kind == "Annotate" and attrs == [UNROLL_ATTR] and isinstance(inputs[1], int) and inputs[1] > cap:
            inst = [kind, [inputs[0], cap], attrs, outputs]
            changed = True
        capped.append(inst)
    return [[capped, decisions], *rest] if changed else None


def choose(candidates: list[Candidate], tolerance: float = TOLERANCE) -> Candidate:
    """The cheapest to build of the candidates within ``tolerance`` of the fastest; of those that
    build about as quickly, the fastest."""
    fastest = min(c.ms for c in candidates)
    fast = [c for c in candidates if c.ms <= fastest * (1 + tolerance)]
    cheapest = min(c.build_s for c in fast)
    return min((c for c in fast if c.build_s <= cheapest + BUILD_SLACK_S), key=lambda c: c.ms)


def candidates(mod: tvm.IRModule, lines: list[str], target: Target, top_k: int = TOP_K,
               workload: Recorded | None = None) -> list[Candidate]:
    """The default schedule, the ``top_k`` fastest distinct records (database lines) of ``mod``, and
    each of those records with its unrolling capped (``workload``: see ``apply_trace``)."""
    found = [Candidate("default", default_schedule(mod["main"], target)[0])]
    seen: set[str] = set()
    for entry in sorted((json.loads(line)[1] for line in lines), key=mean_seconds):
        trace = json.dumps(entry[0])
        if trace in seen or not entry[1]:
            continue
        seen.add(trace)
        for label, variant in ((f"record {len(seen)}", entry),
                               (f"record {len(seen)}, unroll <= {UNROLL_CAP}", capped_unroll(entry))):
            if variant is not None:
                found.extend(from_record(mod, variant, label, workload))
        if len(seen) == top_k:
            break
    return found


def from_record(mod: tvm.IRModule, entry: list, label: str, workload: Recorded | None = None) -> list[Candidate]:
    """The candidate scheduled by replaying ``entry`` (a record's JSON) on ``mod``; none if the record
    no longer applies (logged)."""
    sch = s_tir.Schedule(mod)
    try:
        apply_trace(entry, sch, workload)
    except Exception as err:  # noqa: BLE001 - a record that no longer applies is skipped, not fatal
        log.warning("%s of %s does not apply (%s); skipped", label, mod["main"].attrs.get("global_symbol"),
                    message(err))
        return []
    return [Candidate(label, sch, entry)]


def measure(found: list[Candidate], func: tirx.PrimFunc, target: Target, rounds: int = ROUNDS,
            runs: int = RUNS_PER_ROUND, name: str = "a kernel", values: list | None = None) -> list[Candidate]:
    """Build and load every candidate (timed), then time them in turns on the same random inputs
    (or ``values``, the arguments of one call: arrays, and ints for scalar parameters), each run
    after flushing every tensor argument but the first from the caches.

    Returns the candidates that built; the others are logged and dropped. Timed on this machine, or
    on one server of ``remote.measuring_on``'s tracker, all candidates of a kernel on the same one."""
    if values is None:
        rng = np.random.default_rng(0)
        values = [rng.uniform(-1, 1, [int(d) for d in info.shape]).astype(str(info.dtype))
                  for info in ms.arg_info.ArgInfo.from_prim_func(func)]
    flush = {"f_preproc": "cache_flush_cpu_non_first_arg"} if all(isinstance(v, np.ndarray) for v in values) else {}

    def timed(bench: remote.Bench) -> list[Candidate]:
        args = [tvm.runtime.tensor(value, bench.device) if isinstance(value, np.ndarray) else value
                for value in values]
        built, timers = [], []
        for candidate in found:
            candidate.runs_ms = []  # measured again from the start where a server failed
            start = time.perf_counter()
            try:
                lib = bench.load(tvm.compile(candidate.schedule.mod, target=target,
                                             tir_pipeline=tir_pipeline.pipeline(target)))
                lib.get_function("main")  # LLVM generates the machine code when a function is first looked up
            except Exception as err:  # noqa: BLE001 - one candidate failing to build drops that candidate only
                if bench.session is not None and remote.server_failed(err):
                    raise  # measured again on another server
                log.warning("%s does not build (%s); dropped", candidate.label, message(err))
                continue
            candidate.build_s = time.perf_counter() - start
            timer = lib.time_evaluator("main", bench.device, number=1, repeat=runs, **flush)
            timer(*args)  # warm-up: first touch of the inputs, the thread pool, the code
            built.append(candidate)
            timers.append(timer)
        timed = in_turns({str(i): (lambda _round, timer=timer: [s * 1e3 for s in timer(*args).results])
                          for i, timer in enumerate(timers)}, rounds)
        for candidate, turns in zip(built, timed.values()):
            candidate.runs_ms = [ms for each in turns for ms in each]
        return built

    return remote.on_bench(timed, f"the schedules of {name}")


@dataclass
class Selection:
    """Choose the schedule of each kernel of a model and keep the choices in its store of the cache."""

    store: RecordStore
    target: Target
    reselect: bool = False  # measure again even kernels whose records did not change

    def run(self, tasks: list[ms.ExtractedTask], wanted: set[str] | None = None, deadline: float | None = None) -> dict:
        """Select every kernel of ``tasks`` (of those named in ``wanted``, if given) that has records and
        no up-to-date choice, none begun after ``deadline`` (``time.time()``; those left replay their best
        record until a later run selects them); returns a summary over all of ``tasks``."""
        if self.target.kind.name != "llvm":  # the candidates are timed in this process, on its CPU
            return {"selected": 0, "skipped": "selection measures on the CPU; GPU kernels keep their best record"}
        hashes = {workload_hash(t.dispatched[0]): t for t in tasks}
        lines = self.store.records_of(hashes)
        chosen = self.store.selections()
        todo = [h for h, t in hashes.items() if lines.get(h) and (wanted is None or t.task_name in wanted)
                and (self.reselect or chosen.get(h, {}).get("records") != len(lines[h]))]
        started, done = time.perf_counter(), 0
        for key in tqdm(todo, desc="[relaxc] select", unit="kernel", file=tvm_log.console(), dynamic_ncols=True):
            if deadline is not None and time.time() >= deadline:
                break
            done += 1
            task = hashes[key]
            entry = self._select(task, lines[key], recorded(self.store, key))
            chosen[key] = entry
            self.store.save_selections({key: entry})  # one kernel at a time: an interrupted run keeps the rest
            default = (f"default {entry['default_ms']:.3f} ms" if entry["default_ms"] is not None
                       else "the default did not build")
            log.debug("select %s: %s, %.3f ms (%s; %d candidates)", task.task_name, entry["choice"], entry["ms"],
                     default, entry["candidates"])
        decided = [(t, chosen[h]) for h, t in hashes.items() if h in chosen]
        seconds = time.perf_counter() - started
        return {"selected": done, "left_to_select": len(todo) - done,
                "seconds_per_kernel": round(seconds / done, 2) if done else None, "kernels_with_choice": len(decided),
                "chose_default": sorted(t.task_name for t, e in decided if e["choice"] == "default"),
                "estimated_ms": round(sum(float(t.weight) * e["ms"] for t, e in decided), 3),
                "estimated_default_ms": round(sum(float(t.weight) * e["default_ms"] for t, e in decided
                                                  if e["default_ms"] is not None), 3)}

    def _select(self, task: ms.ExtractedTask, lines: list[str], workload: Recorded) -> dict:
        mod = task.dispatched[0]
        measured = measure(candidates(mod, lines, self.target, workload=workload), mod["main"], self.target,
                           name=task.task_name)
        winner = choose(measured)
        default = next((c for c in measured if c.record is None), None)  # None: it did not build
        record = winner.record and [winner.record[0], [winner.ms / 1e3], *winner.record[2:]]
        return {"task": task.task_name, "choice": winner.label, "record": record,
                "ms": round(winner.ms, 4), "build_s": round(winner.build_s, 3),
                "default_ms": default and round(default.ms, 4), "default_build_s": default and round(default.build_s, 3),
                "fastest_ms": round(min(c.ms for c in measured), 4), "candidates": len(measured),
                "records": len(lines), "tolerance": TOLERANCE, "selected_on": time.strftime("%Y-%m-%d %H:%M:%S")}
