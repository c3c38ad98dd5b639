"""Tuning a model: MetaSchedule over its kernels into the cache, then each kernel's schedule
chosen by measurement, alone or in the model's own sequence of calls (``relaxc.tune``)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from relaxc.build.options import Options, TuneOptions

if TYPE_CHECKING:
    from relaxc.build.artifact import Artifact
    from relaxc.frontend import Constants, DimBounds, ModelLike, Shapes
    from relaxc.support.targets import TargetLike

log = logging.getLogger("relaxc")


def tune_model(model: "ModelLike", target: "TargetLike", shapes: "Shapes | None", constants: "Constants | None",
               options: dict[str, Any], dim_bounds: "DimBounds | None" = None,
               tune_sizes: dict[str, list[int]] | None = None) -> dict:
    """``relaxc.tune``: its options as keywords of ``TuneOptions`` and ``Options``; returns the summary.
    With ``dim_bounds``, each kernel of dynamic extents is tuned at ``tune_sizes``
    (``schedules/dynamic_tuning.py``)."""
    from relaxc.runtime import diagnostics
    from relaxc.build.pipeline import compile_model
    from relaxc.runtime.runner import open_device
    from relaxc.schedules import dynamic_tuning
    from relaxc.schedules.tuning import tune_module, tuning_tasks
    from relaxc.support import remote, tvm_log
    from relaxc.support.errors import UserError

    started = time.time()  # minutes count from here: the compile and the dispatch measured are part of them
    tune_fields = {f.name for f in dataclasses.fields(TuneOptions)}
    settings = TuneOptions(**{k: v for k, v in options.items() if k in tune_fields})
    given = {k: v for k, v in options.items() if k not in tune_fields}
    shard = settings.shard_index()  # checked before any work
    if given.get("dispatch", "replay") == "replay":  # tuning a model for this CPU measures its dispatch too
        given["dispatch"] = "measure"
    compile_options = Options(**given, tuning="off")
    tracker = remote.Tracker.parse(compile_options.rpc, compile_options.rpc_key) if compile_options.rpc else None
    if tracker and settings.selection == "sequence":
        raise UserError("selection='sequence' times the whole model on this machine; with rpc, kernels are "
                        "selected alone on the devices (selection='alone')")
    if shard and settings.selection == "sequence":
        raise UserError("a shard selects nothing (its kernels are selected after the merge): use selection='alone'")
    if tune_sizes and not dim_bounds:
        raise UserError("tune sizes size the dims a model keeps dynamic: give their bounds too (dim_bounds, "
                        "--dim-bound NAME=N)")
    if dim_bounds and settings.selection == "sequence":
        raise UserError("selection='sequence' times the model at one size; a model with dynamic dims has each "
                        "kernel selected alone at the tune sizes (selection='alone')")
    sizes = dynamic_tuning.tune_sizes(dim_bounds, tune_sizes) if dim_bounds else None  # checked before any work
    art = compile_model(model, target, shapes, compile_options, constants, dim_bounds)
    if art.target.kind.name != "llvm":
        open_device(art.target.kind.name)  # tuning measures on the device: refuse clearly without one
    with tvm_log.captured() as said, remote.measuring_on(tracker):  # MetaSchedule's workers inherit stderr
        tasks, of_dynamic = (dynamic_tuning.instances(art.target, sizes, tuning_tasks(art.module("fuse"), art.target))
                             if sizes else (None, None))
        tune_kernels = functools.partial(tune_module, target=art.target, trials=settings.trials,
                                         trials_per_task=settings.trials_per_task,
                                         minutes=settings.minutes and max(settings.minutes - (time.time() - started) / 60,
                                                                          1e-6),
                                         cache_dir=compile_options.cache_dir, fingerprint=art.fingerprint,
                                         model=art.report()["model"], kernels=tuple(settings.kernels),
                                         shard=shard, tasks=tasks)
        summary = tune_kernels(art.module("fuse"), reselect=settings.reselect, select=settings.selection == "alone")
        if sizes:
            summary["dynamic"] = (_choose_dynamic(art, tasks, of_dynamic, sizes, compile_options.cache_dir)
                                  if shard is None else
                                  {"skipped": "a shard: choose after merging the shards' stores (--trials 0)"})
        if settings.selection == "sequence":
            replay = dataclasses.replace(compile_options, tuning="replay")
            summary.update(_in_sequence(lambda: compile_model(model, target, shapes, replay, constants), tune_kernels,
                                        settings, compile_options.cache_dir))
    report = art.report()
    diagnostics.translate(said)
    summary["measured_on"] = f"RPC tracker {tracker}" if tracker else "this machine"
    if "dispatch" in report:
        summary["dispatch"] = {k: report["dispatch"][k] for k in ("choices", "sources")}
    return summary


def _choose_dynamic(art: "Artifact", tasks: list, of_dynamic: dict, sizes: list, cache_dir: str | None) -> dict:
    """``dynamic_tuning.choose`` over the dynamic kernels of ``art`` (``of_dynamic``), with the
    records tuning chose for their instances (among ``tasks``)."""
    from relaxc.schedules.cache import store_for, workload_hash
    from relaxc.schedules.dynamic_tuning import choose
    from relaxc.schedules.replay import chosen_traces

    store = store_for(cache_dir, art.target)
    traces, sources = chosen_traces(store, tasks)
    decided = {workload_hash(t.dispatched[0]) for t in tasks if t.task_name in sources}
    return choose(of_dynamic, traces, decided, store, art.target, art.dim_bounds, sizes)


def _in_sequence(compile_replayed: "Callable[[], Artifact]", tune_kernels: "Callable[..., dict]",
                 settings: TuneOptions, cache_dir: str | None) -> dict:
    """``selection="sequence"`` after tuning: dispatch decided in the model, the kernels of the
    implementations it changed to tuned, then every kernel's schedule selected in the model."""
    from relaxc.schedules.dispatch import forcing

    def replayed(forced: dict[str, str] | None = None) -> "Artifact":
        with forcing(forced or {}):
            return compile_replayed()

    art = replayed()
    summary = {"dispatch_in_sequence": _dispatch_in_sequence(art, replayed, cache_dir)}
    if summary["dispatch_in_sequence"]["changed"]:
        art = replayed()
        untuned = art.report()["tuning"]["missing"]
        if settings.trials and untuned:  # the kernels of the implementations now chosen, and only those
            summary["tuned_after_dispatch"] = tune_kernels(art.module("fuse"), select=False, kernels=tuple(untuned))
            art = replayed()
        untuned = summary["dispatch_in_sequence"]["untuned"] = art.report()["tuning"]["missing"]
        if untuned:  # tuning="strict" would refuse the model until they are tuned
            log.warning("dispatch in sequence chose implementations whose kernels have no tuning record (%s): "
                        "tune them (relaxc tune with --trials) before compiling with tuning='strict'",
                        ", ".join(untuned))
    summary["selection"] = _select_in_sequence(art, settings.kernels, cache_dir)
    return summary


def _dispatch_in_sequence(art: "Artifact", compile_forced: "Callable[[dict[str, str]], Artifact]",
                          cache_dir: str | None) -> dict:
    """``schedules.dispatch_sequence.decide_in_sequence`` for the convolutions of ``art`` (compiled
    replaying the records) whose dispatch has more than one accurate candidate; ``compile_forced``
    compiles the model with some workloads' candidates fixed."""
    import tvm

    from relaxc.build.profile import model_calls
    from relaxc.runtime.runner import random_inputs
    from relaxc.schedules.cache import store_for
    from relaxc.schedules.decisions import DecisionStore
    from relaxc.schedules.dispatch_sequence import Variant, contested, decide_in_sequence

    if art.target.kind.name != "llvm" or "dispatch" not in art.report():  # GPUs: one implementation so far
        return {"workloads": 0, "changed": []}
    inputs = random_inputs(art.inputs, high=art.input_high)

    def build(workload: str, candidate: str) -> Variant:
        variant = compile_forced({workload: candidate})
        vm, calls = model_calls(variant, inputs)
        kernels = {gv.name_hint: f for gv, f in variant.module("final").functions.items()
                   if isinstance(f, tvm.tirx.PrimFunc)}
        return Variant(calls, kernels, vm)

    store = DecisionStore(store_for(cache_dir, art.target), "dispatch")
    return decide_in_sequence(contested(art.report()["dispatch"]["convolutions"]), build, store,
                              art.report()["model"])


def _select_in_sequence(art: "Artifact", kernels: tuple[str, ...], cache_dir: str | None) -> dict:
    """``schedules.sequence.select_in_sequence`` on one inference of ``art`` (compiled replaying the
    records), for the kernels matching the ``kernels`` globs (all if none)."""
    import fnmatch

    import tvm

    from relaxc.build.profile import model_calls
    from relaxc.runtime.runner import random_inputs
    from relaxc.schedules.cache import store_for
    from relaxc.schedules.sequence import select_in_sequence

    on_cpu = art.target.kind.name == "llvm"  # GPU kernels keep their best record: nothing to run here
    _vm, calls = model_calls(art, random_inputs(art.inputs, high=art.input_high)) if on_cpu else (None, [])
    fused = {gv.name_hint: f for gv, f in art.module("fuse").functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    wanted = {name for name in fused if any(fnmatch.fnmatchcase(name, k) for k in kernels)} if kernels else None
    return select_in_sequence(calls, fused, store_for(cache_dir, art.target), art.target, wanted,
                              model=art.report()["model"])
