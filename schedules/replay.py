"""Replaying tuning records at compile time: each kernel scheduled by its chosen record.

``ApplyTuningRecords`` is the pipeline's tuning phase (``tuning=`` ``MODES``): each kernel that
has a record in the target's store of the cache gets it replayed (the record its selection chose,
else the fastest when tuned, ``chosen_traces``); ``strict`` fails naming every kernel without
one; ``tune`` tunes what is missing first (``schedules/tuning.py``).
"""

from __future__ import annotations

import collections
import json
import logging
import os

import tvm
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.target import Target

from relaxc.passes.ir import IS_SCHEDULED
from relaxc.schedules import dynamic_tuning
from relaxc.schedules.cache import RecordStore, cache_root, shipped_root, store_for, stores, workload_hash
from relaxc.schedules.selection import apply_trace, recorded
from relaxc.schedules.tuning import DEFAULT_TRIALS, tune_module, tuning_tasks
from relaxc.support import targets, tvm_internals
from relaxc.support.errors import UserError, message

log = logging.getLogger("relaxc")
MODES = ("off", "replay", "strict", "tune")  # what compile does with the records (ApplyTuningRecords)
DYNAMIC_SOURCES = (dynamic_tuning.RECORD, dynamic_tuning.DEFAULT)


@tvm.transform.module_pass(opt_level=0, name="relaxc.ApplyTuningRecords")
class ApplyTuningRecords:
    """Schedule every kernel that has a tuning record with its best record (``replay``); ``strict``
    also fails naming every kernel without one; ``tune`` first tunes what is missing; ``off``
    leaves every kernel to the default schedules. ``summary()`` is ``report()["tuning"]``."""

    report_key = "tuning"

    def __init__(self, mode: str, cache_dir: str | None, trials: int = DEFAULT_TRIALS, model: str = "MODEL") -> None:
        if mode not in MODES:
            raise ValueError(f"tuning mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self.cache_dir = cache_dir
        self.trials = trials
        self.model = model  # for the command that would tune it
        self.report: dict = {}

    def summary(self) -> dict:
        return self.report

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        target = Target.current()
        store = store_for(self.cache_dir, target)
        tasks = tuning_tasks(mod, target)
        self.report = {"mode": self.mode, "cache_dir": store.dir, "shipped": store.base and store.base.dir,
                       "tasks": len(tasks), "tasks_with_records": 0, "missing": [t.task_name for t in tasks]}
        if self.mode == "off":
            return mod
        if self.mode == "tune":
            if any(dynamic_tuning.dims_used(t.dispatched[0]["main"]) for t in tasks):
                raise UserError("tuning='tune' tunes kernels of static extents; for a model with dynamic dims, tune "
                                "it at the sizes that matter first (relaxc.tune(..., dim_bounds=, tune_sizes=), "
                                "relaxc tune --dim-bound --tune-sizes), then compile replays the records")
            self.report["tuned"] = tune_module(mod, target, trials=self.trials, cache_dir=self.cache_dir)
        if not store.exists():
            self._no_store(store, target)
            return self._finish(mod, tasks, None)
        if not store.compatible():
            log.warning("ignoring %s: its records were tuned with other versions %s", store.dir,
                        store.manifest().get("versions"))
            return self._finish(mod, tasks, None)
        return self._finish(mod, tasks, store)

    def _no_store(self, store: RecordStore, target: Target) -> None:
        """Say (report, and a progress line that ``-q`` hides: the summary says it too) that no records
        are for this target, which stores there are, and what would tune for it."""
        root = cache_root(self.cache_dir)
        others = sorted(set(stores(root, records=True))
                        | set(stores(shipped_root() or "", records=True) if self.cache_dir is None else ()))
        spec = {k: v for k, v in targets.describe(target).items() if k in ("kind", "mcpu", "num-cores")}
        command = f"relaxc tune {self.model} -t '{json.dumps(spec, separators=(',', ':'))}'" + \
            (f" --cache-dir {root}" if self.cache_dir else "")
        self.report.update(store=None, stores=others, tune_command=command)
        if self.mode == "replay":
            log.info("no tuning records for %s in %s (stores there: %s): the default schedules run; to tune for "
                     "this CPU: %s", os.path.basename(store.dir), root, ", ".join(others) or "none", command)

    def _finish(self, mod: tvm.IRModule, tasks: list, store: RecordStore | None) -> tvm.IRModule:
        traces, sources = chosen_traces(store, tasks) if store is not None else ({}, {})
        mod, failed = apply_traces(mod, traces, store)
        not_applied = {t.task_name: failed[key] for key, t in ((workload_hash(t.dispatched[0]), t) for t in tasks)
                       if key in failed} if failed else {}
        if store is not None:  # kernels of dynamic extents: the records dynamic_tuning chose, relaxed
            mod, dynamic, dynamic_failed = dynamic_tuning.apply_dynamic(mod, store)
            sources.update(dynamic)
            not_applied.update(dynamic_failed)
        if not_applied:
            log.warning("%d tuning record(s) in %s do not apply to their kernels, which run their default schedules "
                        "instead: %s", len(not_applied), self.report["cache_dir"],
                        "; ".join(f"{name} ({why})" for name, why in sorted(not_applied.items())))
        sources = {name: how for name, how in sources.items() if name not in not_applied}
        missing = [t.task_name for t in tasks if t.task_name not in sources]
        counts = collections.Counter(sources.values())
        self.report.update(tasks_with_records=len(sources), missing=missing, records_not_applied=not_applied,
                           selected=sum(counts[how] for how in ("selected", "default (selected)", *DYNAMIC_SOURCES)),
                           chose_default=sorted(name for name, how in sources.items()
                                                if how in ("default (selected)", dynamic_tuning.DEFAULT)))
        if self.mode == "strict" and missing:
            raise UserError(f"tuning='strict': {len(missing)} of {len(tasks)} kernels have no tuning record "
                            f"that applies in {self.report['cache_dir']}: {', '.join(missing)}")
        return mod


def chosen_traces(store: RecordStore, tasks: list[ms.ExtractedTask]) -> tuple[dict[str, list], dict[str, str]]:
    """The record to replay on each kernel (by workload hash), and how each kernel's schedule was
    decided: "selected" (measured against the others, ``schedules/selection.py``), "default
    (selected)" (the default won, so no record is replayed) or "best record" (not selected: the
    record that was fastest when tuned). Kernels without records are absent from both."""
    hashes = {workload_hash(t.dispatched[0]): t for t in tasks}
    chosen = {key: entry for key, entry in store.selections().items() if key in hashes}
    fallback = store.best_records(set(hashes) - set(chosen)) if len(chosen) < len(hashes) else {}
    traces: dict[str, list] = {}
    sources: dict[str, str] = {}
    for key, task in hashes.items():
        entry = chosen.get(key)
        if entry is not None and entry["choice"] == "default":
            sources[task.task_name] = "default (selected)"
        elif entry is not None or key in fallback:
            traces[key] = entry["record"] if entry is not None else fallback[key]
            sources[task.task_name] = "selected" if entry is not None else "best record"
    return traces, sources


def apply_traces(mod: tvm.IRModule, traces: dict[str, list],
                 store: RecordStore | None = None) -> tuple[tvm.IRModule, dict[str, str]]:
    """A copy of ``mod`` with each kernel that has a record in ``traces`` scheduled by replaying it
    (what MetaSchedule's ``MetaScheduleApplyDatabase`` does, without building a database first:
    that replayed every trace twice), and why each record that does not replay failed, by workload
    hash (its kernels are left to their default schedules). Kernels are matched as MetaSchedule
    keys them: the structural hash of the kernel alone as ``main``; a record whose blocks this
    kernel names otherwise is replayed with the names of the kernel in ``store`` it was tuned on
    (``selection.apply_trace``)."""
    failed: dict[str, str] = {}
    if not traces:
        return mod, failed
    result = mod.clone()
    for gv, func in mod.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        kernel = tvm_internals.kernel_module(func)
        key = workload_hash(kernel)
        record = traces.get(key)
        if record is None:
            continue
        sch = s_tir.Schedule(kernel)
        try:
            apply_trace(record, sch, None if store is None else recorded(store, key))
        except Exception as err:  # noqa: BLE001 - whatever TVM raises, the record does not replay here
            failed[key] = message(err, last=True)
            continue
        result[gv] = sch.mod["main"].with_attrs(func.attrs).with_attr(IS_SCHEDULED, True)
    return result, failed
