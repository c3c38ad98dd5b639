"""Kernel tuning with MetaSchedule and XGBoost, into the target's store of the cache.

Tasks are the kernels of the module after layout and fusion, the same PrimFuncs the default
schedules would get, so a record applies exactly where it was measured. Every measured record is
appended to the target's database as it comes (MetaSchedule's JSON database), so Ctrl-C or kill -9
loses nothing already measured, and a rerun counts the records on disk and tunes only what is
still short of its budget.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import time
from dataclasses import dataclass, field

import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.target import Target

from tvm.ir.utils import derived_object
from tqdm import tqdm

from relaxc.schedules import builder
from relaxc.schedules.cache import neighbour, store_for, workload_hash
from relaxc.passes.ir import IS_SCHEDULED
from relaxc.schedules.default import default_schedule
from relaxc.schedules.selection import Selection, from_record
from relaxc.schedules.trials import make_runner, search_space, search_strategy
from relaxc.support import remote, tvm_internals, tvm_log
from relaxc.support.errors import UserError, message
from relaxc.support.threads import configure_threads, physical_cores

log = logging.getLogger("relaxc")
DEFAULT_TRIALS = 2000  # measurements of one tuning run, by compiler.tune and by tuning="tune"
TRIALS_PER_ITER = 64
SELECT_SECONDS = 1.0  # kept a kernel for its selection in a run with minutes: SqueezeNet's took 0.35 s on Zen 4


@dataclass
class Progress:
    """Trials done, best latency per task and the time left, as a progress bar (on relaxc's console)."""

    names: list[str]
    weights: list[float]
    total_trials: int
    deadline: float | None
    default_us: dict[int, float] = field(default_factory=dict)  # each task's default schedule, measured first
    trials: int = 0
    best_us: dict[int, float] = field(default_factory=dict)
    lost: dict[int, list[str]] = field(default_factory=dict)  # task -> why each trial lost with its RPC server

    def __post_init__(self) -> None:
        self.bar = tqdm(total=self.total_trials, desc="[relaxc] tune", unit="trial", file=tvm_log.console(),
                        dynamic_ncols=True)

    def update(self, task_id: int, seconds: list[float]) -> None:
        self.trials += len(seconds)
        finite = [s for s in seconds if s < 1e9]
        if finite:
            self.best_us[task_id] = min(self.best_us.get(task_id, float("inf")), min(finite) * 1e6)
        estimate = sum(self.weights[i] * us for i, us in self.best_us.items()) / 1e3
        stop = (f", stops in {max(0.0, self.deadline - time.time()) / 60:.1f} min"
                if self.deadline is not None else "")
        gain = f", {self.gain():.2f}x the defaults" if self.gain() else ""
        self.bar.set_postfix_str(f"{len(self.best_us)}/{len(self.names)} kernels, sum {estimate:.2f} ms{gain}{stop}, "
                                 f"last {self.names[task_id]}", refresh=False)
        self.bar.update(len(seconds))

    def gain(self) -> float | None:
        """The defaults' weighted time over the best's, over the kernels tuned so far that have both."""
        both = [i for i in self.best_us if i in self.default_us]
        best = sum(self.weights[i] * min(self.best_us[i], self.default_us[i]) for i in both)
        return sum(self.weights[i] * self.default_us[i] for i in both) / best if best else None

    def lose(self, task_id: int, errors: list[str]) -> None:
        """Trials whose RPC server failed them (measured again, on another server where there is one)."""
        self.lost.setdefault(task_id, []).extend(errors)

    def lost_summary(self) -> list[dict]:
        return [{"kernel": self.names[i], "trials": len(errors), "error": errors[0]} for i, errors in self.lost.items()]

    def close(self) -> None:
        self.bar.close()


@derived_object
class _Measured(ms.measure_callback.PyMeasureCallback):
    """MetaSchedule's measure callbacks (``inner``: records saved, cost model updated) on the trials
    measured, then ``progress`` fed. Trials whose RPC server failed them (``remote_runs``) are kept
    from both, counted lost: they say nothing of their candidate."""

    def __init__(self, inner: list, progress: Progress, task_index: int, remote_runs: bool) -> None:
        self.inner = inner
        self.progress = progress
        self.task_index = task_index
        self.remote_runs = remote_runs

    def apply(self, scheduler, task_id, candidates, builder_results, runner_results) -> None:
        kept, lost = [], []
        for i, result in enumerate(runner_results):
            if result.error_msg and self.remote_runs and remote.server_failed(str(result.error_msg)):
                lost.append(message(str(result.error_msg), last=True))
            else:
                kept.append(i)
        for callback in self.inner:
            if isinstance(callback, ms.measure_callback.RemoveBuildArtifact):  # every trial's built files go
                callback.apply(scheduler, task_id, candidates, builder_results, runner_results)
            else:
                callback.apply(scheduler, task_id, [candidates[i] for i in kept],
                               [builder_results[i] for i in kept], [runner_results[i] for i in kept])
        seconds = []
        for result in (runner_results[i] for i in kept):
            times = [float(t) for t in result.run_secs] if result.run_secs else []
            seconds.append(sum(times) / len(times) if times and not result.error_msg else 1e10)
        self.progress.update(self.task_index, seconds)
        if lost:
            self.progress.lose(self.task_index, lost)


def _quiet_metaschedule() -> None:
    """MetaSchedule's own console output (statistics tables and XGBoost lines on stdout) gives way to
    relaxc's progress line; its per-task logs still go to ``<store>/logs/``. Unnamed handlers left on its logger by an
    earlier run in this process would break its logging set-up (it formats handler names)."""
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    ms_logger.setLevel(logging.WARNING)
    for handler in list(ms_logger.handlers):
        if handler.get_name() is None:
            ms_logger.removeHandler(handler)


def tuning_tasks(mod: tvm.IRModule, target: Target) -> list[ms.ExtractedTask]:
    """MetaSchedule's tasks of ``mod``, less the kernels relaxc wrote scheduled (the index checks)."""
    return [task for task in ms.relax_integration.extract_tasks(mod, target)
            if not task.dispatched[0]["main"].attrs.get(IS_SCHEDULED, False)]


def _records(database, task: ms.ExtractedTask) -> int:
    """How many valid records the database holds for ``task``."""
    mod = task.dispatched[0]
    if not database.has_workload(mod):
        return 0
    return len(database.get_top_k(database.commit_workload(mod), 10**6))


def tune_module(mod: tvm.IRModule, target: Target, *, trials: int, trials_per_task: int | None = None,
                minutes: float | None = None, cache_dir: str | None = None, fingerprint: str = "",
                model: str = "", reselect: bool = False, kernels: tuple[str, ...] = (), select: bool = True,
                shard: tuple[int, int] | None = None, tasks: list[ms.ExtractedTask] | None = None) -> dict:
    """Tune the kernels of ``mod`` (after layout and fusion) into the target's store of the cache.

    MetaSchedule commits a task's measurements to the database only when its scheduler next visits
    the task, a whole round of tasks later, so a killed run would lose every batch of the round.
    Here each ``tune_tasks`` call measures one batch of one task and commits it before returning;
    the tasks take turns, round by round, sharing one XGBoost cost model. Then every kernel whose
    records changed (all of them with ``reselect``) gets its schedule chosen by measuring the
    default and its best records side by side (``schedules/selection.py``); ``trials=0`` only does that.
    ``kernels`` (glob patterns of kernel names) limits tuning and selection to the kernels that match:
    ``trials=0, reselect=True`` with ``kernels`` measures only those again. ``select`` False leaves
    the selection to the caller (``compiler.tune`` with ``selection="sequence"``). ``shard`` (i, n)
    tunes the i-th of n disjoint shares of the kernels (``shard_of``) and selects nothing: the shards'
    stores are merged first. ``tasks``: the kernels to tune instead of ``mod``'s (a dynamic model's
    static instances, ``dynamic_tuning.instances``).

    Within ``remote.measuring_on(tracker)`` every candidate is built here and timed on a server of
    the tracker, as many at once as there are servers; a trial whose server fails is counted lost
    (``summary["lost"]``) and its kernel gets another batch, so the others finish the run.
    """
    if trials < 0:
        raise UserError(f"trials must be at least 0, not {trials}")
    configure_threads()  # the measuring workers inherit it
    tvm_internals.skip_tensor_intrinsics(target)
    store = store_for(cache_dir, target)
    tasks = tuning_tasks(mod, target) if tasks is None else tasks
    wanted = {t.task_name for t in tasks
              if not kernels or any(fnmatch.fnmatchcase(t.task_name, k) for k in kernels)}
    if not wanted:
        raise UserError(f"no kernel matches {', '.join(kernels)}; the kernels are: "
                        f"{', '.join(t.task_name for t in tasks)}")
    if shard is not None:
        wanted &= shard_of(tasks, *shard)
        select = False
        if not wanted:
            raise UserError(f"shard {shard[0]}/{shard[1]} of this model's {len(tasks)} kernels is empty: use fewer "
                            "shards than kernels")
    per_task = trials_per_task or max(TRIALS_PER_ITER, trials // max(1, len(tasks)))
    batch = min(TRIALS_PER_ITER, per_task)
    started = time.time()
    deadline = started + minutes * 60 if minutes else None
    with store.lock():
        if store.exists() and not store.compatible():
            raise UserError(f"{store.dir} holds records tuned with other versions "
                            f"({store.manifest().get('versions')}); tune into another --cache-dir")
        database = store.database(writable=True)
        have = [_records(database, task) for task in tasks]
        todo = [i for i, task in enumerate(tasks) if have[i] < per_task and task.task_name in wanted]
        budget = min(trials, sum(per_task - have[i] for i in todo))
        summary = {"tasks": len(tasks), "tasks_tuned": len(todo), "trials_budget": budget,
                   "records_before": sum(have), "stopped": "done", "cache_dir": store.dir, "trials": 0}
        runner = make_runner(target) if budget > 0 else None  # starts processes: one runner for the whole run
        build = builder.PooledBuilder() if runner else None  # and one builder
        try:
            fresh = [i for i in todo if have[i] == 0]
            defaults, lost = (_commit_defaults([tasks[i] for i in fresh], target, database, (build, runner))
                              if runner else ([], []))
            summary["defaults_recorded"] = sum(us is not None for us in defaults)
            if runner and not any(have):  # a model new to this store: from a neighbour CPU's records, if any
                summary["from_neighbour"] = _commit_neighbours([tasks[i] for i in fresh], target, store, database,
                                                               (build, runner))
            if todo and runner:
                tuning_ends = deadline and deadline - selection_reserve(len(todo) if select else 0, deadline - started)
                summary.update(_tune_rounds(tasks, {i: per_task - have[i] for i in todo}, batch, budget, tuning_ends,
                                            store.dir, database, (build, runner),
                                            {i: us for i, us in zip(fresh, defaults) if us is not None}))
            lost += summary.pop("lost", [])
            if lost:  # each measured again on another server, where there was one
                summary["lost"] = lost
                log.warning("measurements lost with their RPC server: %s",
                            "; ".join(f"{e['kernel']}: {e['trials']} ({e['error']})" for e in lost))
        finally:
            if build is not None:
                build.shutdown()
            if getattr(runner, "pool", None) is not None:  # garbage-collected in one of its threads, it cannot
                runner.pool.shutdown()
        after = [_records(database, task) for task in tasks]
        summary["records_after"] = sum(after)
        if summary["stopped"].startswith(remote.NO_SERVER):
            summary["selection"] = {"selected": 0, "skipped": "no RPC server left to measure on"}
        else:
            summary["selection"] = (Selection(store, target, reselect).run(tasks, wanted, deadline) if select else
                                    {"selected": 0, "skipped": "a shard: select after merging the shards' stores"
                                     if shard else "selected in the model's sequence instead"})
        summary["minutes"] = round((time.time() - started) / 60, 2)
        if fingerprint:
            previous = store.manifest().get("fingerprints", {}).get(fingerprint, {})
            store.update_manifest(target, fingerprint, {
                "model": model, "tasks": [t.task_name for t in tasks],
                "complete": all(count > 0 for count in after),
                "trials": previous.get("trials", 0) + summary["trials"],
                "minutes": round(previous.get("minutes", 0) + summary["minutes"], 2),
                "last_tuned": time.strftime("%Y-%m-%d %H:%M:%S"),
            })
    return summary


Measure = tuple[ms.builder.Builder, ms.runner.Runner | str]  # how candidates are built and timed


def selection_reserve(kernels: int, seconds: float) -> float:
    """Seconds of a run of ``seconds`` kept for selecting ``kernels`` after tuning: ``SELECT_SECONDS``
    each, at most a quarter of the run."""
    return min(kernels * SELECT_SECONDS, seconds / 4)


def _tune_rounds(tasks: list[ms.ExtractedTask], left: dict[int, int], batch: int, budget: int,
                 deadline: float | None, work_dir: str, database, measure: Measure,
                 defaults: dict[int, float] | None = None) -> dict:
    """Tune the tasks ``left`` (task index -> trials still to measure) in rounds of one batch each,
    within ``budget`` trials and the ``deadline``: a batch starts only where the task's last one (the
    slowest batch so far, before its first) would end by then, and a task whose batch measures nothing
    new (its search space spent) leaves the rounds. Returns the trials measured, why it stopped, the
    tasks spent, the estimated gain over ``defaults`` (task index -> its default's microseconds) and the
    trials lost with an RPC server."""
    tracker = remote.measuring_tracker()
    result: dict = {"stopped": "done", "spent": []}
    progress = Progress([t.task_name for t in tasks], [float(t.weight) for t in tasks], budget, deadline,
                        dict(defaults or {}))
    took: dict[int, float] = {}  # seconds of each task's last batch
    callbacks = list(ms.measure_callback.MeasureCallback.create("default"))
    cost_model = ms.cost_model.XGBModel(num_tuning_cores=physical_cores())
    retries = dict(left)  # trials of a task lost with a server are measured again, up to its budget once more
    started = time.perf_counter()
    try:
        while left and progress.trials < budget and result["stopped"] == "done":
            started_round = progress.trials
            for i in list(left):
                expected = took.get(i, max(took.values(), default=0.0))
                if deadline is not None and time.time() + expected >= deadline:
                    continue  # would end past the deadline: another task's batch may still fit
                size = min(batch, left[i], budget - progress.trials)
                if size <= 0:
                    break
                lost = len(progress.lost.get(i, ()))
                began = time.perf_counter()
                done = _tune_batch(tasks[i], i, size, work_dir, database, cost_model, measure, callbacks, progress,
                                   tracker is not None)
                took[i] = time.perf_counter() - began
                lost = len(progress.lost.get(i, ())) - lost
                if lost and not done and not tracker.any_server():
                    result["stopped"] = f"{remote.NO_SERVER}: none is left under {tracker}"
                    break
                retry = lost and len(progress.lost[i]) <= retries[i]
                left[i] -= done if retry else max(done, 1)
                if left[i] <= 0 or (not done and not lost):  # measured nothing new: its search space is spent
                    result["spent"] += [] if left[i] <= 0 else [tasks[i].task_name]
                    del left[i]
            if deadline is not None and progress.trials == started_round and left:
                result["stopped"] = "time budget"
    finally:
        progress.close()
    result["trials"] = progress.trials
    result["gain_estimate"] = round(progress.gain(), 3) if progress.gain() else None
    seconds = time.perf_counter() - started
    result["trials_per_minute"] = round(progress.trials / seconds * 60, 1) if seconds > 0 else None
    if progress.lost:
        result["lost"] = progress.lost_summary()
    return result


def _commit_defaults(tasks: list, target: Target, database, measure: Measure) -> tuple[list, list]:
    """Measure relaxc's default schedule of each task and commit it as a record (its trace replays it).

    The database then holds the default beside every tuned candidate, so replay picks whichever was
    faster: without it, a short tuning run (SqueezeNet, 16 trials per kernel) made replay 2.7x slower
    than the default schedules. Returns each task's default in microseconds (None where it was not
    committed), and the measurements lost with an RPC server (``summary["lost"]``'s entries).
    """
    if target.kind.name != "llvm" or not tasks:
        return [None] * len(tasks), []
    return _commit_schedules(tasks, [default_schedule(task.dispatched[0]["main"], target)[0] for task in tasks],
                             target, database, measure, "default schedule")


def _commit_neighbours(tasks: list, target: Target, store, database, measure: Measure) -> dict | None:
    """Where relaxc ships no store for ``target``'s CPU, the best record of each of ``tasks`` in the
    shipped store of the nearest CPU of its vector width (``cache.neighbour``), measured here and
    committed: the search starts from them (MetaSchedule seeds its population with the database's
    best). The kernels of CPUs of one vector width are the same, so their records apply as they are.
    Returns the store's name and the kernels seeded, None where there is no such store."""
    near = neighbour(target, store)
    if near is None or not tasks:
        return None
    by_key = {workload_hash(task.dispatched[0]): task for task in tasks}
    found = [(by_key[key], from_record(by_key[key].dispatched[0], record, "neighbour's record"))
             for key, record in near.best_records(set(by_key)).items()]
    found = [(task, candidate[0].schedule) for task, candidate in found if candidate]
    times, _ = _commit_schedules([task for task, _ in found], [sch for _, sch in found], target, database, measure,
                                 "record of " + os.path.basename(near.dir))
    return {"store": os.path.basename(near.dir), "kernels": sum(us is not None for us in times)}


def _commit_schedules(tasks: list, schedules: list, target: Target, database, measure: Measure,
                      what: str) -> tuple[list, list]:
    """Build, time and commit ``schedules`` (one per task) as records; ``_commit_defaults``'s returns."""
    build, runner = measure
    built = build.build([ms.builder.BuilderInput(sch.mod, target) for sch in schedules])
    args = [ms.arg_info.ArgInfo.from_prim_func(task.dispatched[0]["main"]) for task in tasks]
    pending = [i for i, result in enumerate(built) if not result.error_msg]
    committed: list[float | None] = [None] * len(tasks)
    lost_with_server = []
    for _ in range(remote.ATTEMPTS):  # defaults whose RPC server failed are measured again on another
        futures = runner.run([ms.runner.RunnerInput(built[i].artifact_path, "cpu", args[i]) for i in pending])
        lost = []
        for i, future in zip(pending, futures):
            result = future.result()
            if result.error_msg and remote.measuring_tracker() and remote.server_failed(str(result.error_msg)):
                lost.append(i)
                lost_with_server.append({"kernel": f"{tasks[i].task_name} ({what})", "trials": 1,
                                         "error": message(str(result.error_msg), last=True)})
            elif result.error_msg:
                log.warning("%s of %s failed to run: %s", what, tasks[i].task_name, result.error_msg[:200])
            else:
                workload = database.commit_workload(tasks[i].dispatched[0])
                database.commit_tuning_record(ms.database.TuningRecord(
                    schedules[i].trace, workload, result.run_secs, target, args[i]))
                committed[i] = sum(float(s) for s in result.run_secs) / len(result.run_secs) * 1e6
        pending = lost
        if not pending or not remote.measuring_tracker().any_server():
            break
    return committed, lost_with_server


def shard_of(tasks: list[ms.ExtractedTask], index: int, count: int) -> set[str]:
    """The kernels of shard ``index`` of ``count``: every count-th task in the order of their workload
    hashes, so each machine of a sharded run picks the same share of the same model."""
    if not 0 <= index < count:
        raise UserError(f"shard must be i/n with 0 <= i < n, not {index}/{count}")
    ordered = sorted(tasks, key=lambda t: workload_hash(t.dispatched[0]))
    return {t.task_name for t in ordered[index::count]}


def _tune_batch(task: ms.ExtractedTask, index: int, size: int, work_dir: str, database, cost_model,
                measure: Measure, callbacks: list,
                progress: Progress, remote_runs: bool) -> int:
    """Measure one batch of ``task`` with ``measure`` (builder, runner) and commit it; returns the
    trials measured (lost ones not counted)."""
    _quiet_metaschedule()  # each batch's logging set-up sets its logger back to DEBUG
    (context,), weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
        [task], work_dir, space=search_space(task.target), strategy=search_strategy(size))
    before = progress.trials
    ms.tune_tasks(tasks=[context], task_weights=weights, work_dir=work_dir, max_trials_global=size,
                  max_trials_per_task=size, num_trials_per_iter=size, database=database,
                  builder=measure[0], runner=measure[1], cost_model=cost_model,
                  measure_callbacks=[_Measured(callbacks, progress, index, remote_runs)],
                  task_scheduler="round-robin")
    return progress.trials - before
