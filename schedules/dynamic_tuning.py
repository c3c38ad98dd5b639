"""Tuning records for kernels of dynamic extents.

MetaSchedule tunes static kernels only, so a kernel whose extents are expressions of the model's
dynamic dims is tuned as its static kernel at each of the sizes the user names (``instances``:
``passes.ir.at_sizes``, a task of its own). Its best record (as selected) is then applied to the
dynamic kernel relaxed (``dynamic.on_dynamic``: whole tiles and a predicated last one), checked
against the kernel's default schedule at sizes from 1 to the bounds, and timed beside that default
at each named size (``choose``); the record wins only where it is faster over the named sizes
together. The outcome is kept in ``<store>/dynamic.json`` by the dynamic kernel's workload hash,
and compiles replay it (``apply_dynamic``). One schedule serves every size of a kernel: the one
fastest over the sizes the user named, where the default rules give one fast at every size.
"""

from __future__ import annotations

import itertools
import logging
import time

import numpy as np
import tvm
from tvm import s_tir, tirx
from tvm.s_tir import meta_schedule as ms
from tvm.target import Target
from tqdm import tqdm

from relaxc.passes.tir import tir_pipeline
from relaxc.passes.ir import IS_SCHEDULED, at_sizes
from relaxc.schedules.cache import RecordStore, workload_hash
from relaxc.schedules.decisions import DecisionStore
from relaxc.schedules.default import default_schedule
from relaxc.schedules.dynamic import DoesNotReplay, on_dynamic, representative_sizes
from relaxc.schedules.selection import TOLERANCE, Candidate, apply_trace, measure, recorded
from relaxc.support import tvm_internals, tvm_log
from relaxc.support.errors import UserError, message
from relaxc.support.targets import dynamic_multiple

log = logging.getLogger("relaxc")
RECORD, DEFAULT = "record (dynamic)", "default (dynamic, selected)"  # how a compile's dynamic kernel was decided
CHECK_SIZES = (1, 2, 7, 33)  # besides the bounds and the named sizes (and one past each)
RTOL = 1e-4  # a relaxed record's outputs against the default's: reductions may add in another order


def tune_sizes(bounds: dict[str, int], named: dict[str, list[int]] | None) -> list[dict[str, int]]:
    """The size assignments to tune at: every combination of the ``named`` sizes of each dim, a dim
    not named at its bound. A name that is not a dynamic dim, or a size outside 1..bound, is a
    UserError naming it."""
    named = dict(named or {})
    unknown = sorted(set(named) - set(bounds))
    if unknown:
        raise UserError(f"tune sizes name dim(s) {unknown} that the model does not keep dynamic; its dynamic dims "
                        f"are {sorted(bounds) or 'none'} (dim_bounds)")
    for name, sizes in named.items():
        bad = [s for s in sizes if not isinstance(s, int) or not 1 <= s <= bounds[name]]
        if bad or not sizes:
            raise UserError(f"tune sizes of {name!r} must be whole numbers in 1..{bounds[name]} (its bound), "
                            f"not {sizes}")
    dims = sorted(bounds)
    choices = [sorted(set(named.get(d, [bounds[d]]))) for d in dims]
    return [dict(zip(dims, combination)) for combination in itertools.product(*choices)]


def check_sizes(bounds: dict[str, int], tuned: list[dict[str, int]]) -> list[dict[str, int]]:
    """Sizes a relaxed record is checked at: each dim at 1, 2, 7, 33, its bound, every size tuned
    at and one past it (those within its bound), the dims' lists taken side by side."""
    lists = {d: sorted({s for s in (*CHECK_SIZES, bound, *(t[d] for t in tuned), *(t[d] + 1 for t in tuned))
                        if 1 <= s <= bound}) for d, bound in bounds.items()}
    length = max((len(v) for v in lists.values()), default=0)
    return [{d: v[i % len(v)] for d, v in lists.items()} for i in range(length)]


def dims_used(func: tirx.PrimFunc) -> set[str]:
    """The names of the dynamic dims a kernel's shapes and scalar parameters use (none: a static
    kernel; ``passes.ir.is_dynamic`` misses a kernel that takes a dim only as a scalar)."""
    names = {p.name for p in func.params if not isinstance(p.ty, tirx.BufferType)}
    for param in func.params:
        if isinstance(param.ty, tirx.BufferType):
            names |= {v.name for d in param.ty.shape for v in tirx.analysis.undefined_vars(d)}
    return names


Instances = dict[str, tuple[ms.ExtractedTask, list[tuple[dict[str, int], str]]]]


def instances(target: Target, sizes: list[dict[str, int]],
              tasks: list[ms.ExtractedTask]) -> tuple[list[ms.ExtractedTask], Instances]:
    """``tasks`` (MetaSchedule's of a model) with each kernel of dynamic extents replaced by its
    static kernel at each assignment of ``sizes`` (once per distinct size of the dims it uses, named
    ``<kernel>@<dim>=<size>,...``); and, by each dynamic kernel's workload hash, its task and the
    sizes and workload hash of each of its instances."""
    static, of_dynamic = [], {}
    for task in tasks:
        func = task.dispatched[0]["main"]
        used = dims_used(func)
        if not used:
            static.append(task)
            continue
        seen = {}
        for assignment in sizes:
            own = {d: s for d, s in assignment.items() if d in used}
            label = ",".join(f"{d}={s}" for d, s in sorted(own.items()))
            if label in seen:
                continue
            kernel = tvm_internals.kernel_module(at_sizes(func, own))
            seen[label] = (own, workload_hash(kernel))
            static.append(ms.ExtractedTask(f"{task.task_name}@{label}", kernel, target, [kernel], 1))
        of_dynamic[workload_hash(task.dispatched[0])] = (task, list(seen.values()))
    return static, of_dynamic


def arguments_at(func: tirx.PrimFunc, sizes: dict[str, int], seed: int = 0) -> list:
    """Random arguments of one call of ``func`` with its dynamic dims at ``sizes``: arrays in -1..1
    (integer ones zero: indices), and the sizes themselves for its scalar parameters."""
    rng = np.random.default_rng(seed)
    buffers = iter(at_sizes(func, sizes).params)  # its buffers at the sizes, in order (scalars specialised away)
    values: list = []
    for param in func.params:
        if not isinstance(param.ty, tirx.BufferType):
            values.append(sizes[param.name])
            continue
        static = next(buffers).ty
        shape, dtype = [int(d) for d in static.shape], str(static.dtype.dtype)
        values.append(np.zeros(shape, dtype) if dtype.startswith(("int", "uint", "bool"))
                      else rng.uniform(-1, 1, shape).astype(dtype))
    return values


def _outputs(sch: s_tir.Schedule, target: Target, values: list) -> list[np.ndarray]:
    """Every array argument after one call of the kernel ``sch`` schedules on copies of ``values``."""
    lib = tvm.compile(sch.mod, target=target, tir_pipeline=tir_pipeline.pipeline(target)).mod
    args = [tvm.runtime.tensor(v.copy()) if isinstance(v, np.ndarray) else v for v in values]
    lib["main"](*args)
    return [a.numpy() for a in args if isinstance(a, tvm.runtime.Tensor)]


def _agrees(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    for g, w in zip(got, want):
        if g.dtype.kind == "f":
            scale = float(np.max(np.abs(w[np.isfinite(w)]), initial=1.0))
            if not np.allclose(g, w, rtol=RTOL, atol=RTOL * scale, equal_nan=True):
                return False
        elif not np.array_equal(g, w):
            return False
    return True


def relaxed_record(func: tirx.PrimFunc, record: list, sizes: dict[str, int], store: RecordStore,
                   static_key: str) -> s_tir.Schedule:
    """``func`` scheduled by ``record``, tuned on its static kernel at ``sizes`` (workload
    ``static_key`` in ``store``), relaxed onto its dynamic extents; raises ``DoesNotReplay``."""
    static = s_tir.Schedule(at_sizes(func, sizes))
    try:
        apply_trace(record, static, recorded(store, static_key))
    except Exception as err:  # noqa: BLE001 - whatever TVM raises, the record does not apply here
        raise DoesNotReplay(f"the record does not apply at {sizes}: {message(err, last=True)}") from None
    return on_dynamic(static.trace, func, exact=False)


def choose(of_dynamic: Instances, traces: dict[str, list], decided: set[str], store: RecordStore, target: Target,
           bounds: dict[str, int], sizes: list[dict[str, int]]) -> dict:
    """For each dynamic kernel of ``of_dynamic`` (``instances``) with an instance whose schedule is
    ``decided`` (workload hashes: tuned and selected, or a record): its default
    and the record of each of its instances in ``traces`` (by workload hash,
    ``replay.chosen_traces``; none where an instance's default won) relaxed, checked at
    ``check_sizes`` against the default, timed at each of ``sizes``; the choice saved in the
    store's ``dynamic.json``. Returns a summary."""
    todo = [(key, task, found) for key, (task, found) in of_dynamic.items() if any(k in decided for _, k in found)]
    decisions = DecisionStore(store, "dynamic")
    checks = check_sizes(bounds, sizes)
    representative = representative_sizes(bounds, dynamic_multiple(target))
    chosen, rejected = {}, {}
    for key, task, found in tqdm(todo, desc="[relaxc] dynamic kernels", unit="kernel", file=tvm_log.console(),
                                 dynamic_ncols=True):
        func = task.dispatched[0]["main"]
        entry = _choose_one(task.task_name, func, found, traces, store, target, checks, sizes, representative)
        chosen[task.task_name] = entry["choice"]
        if entry["rejected"]:
            rejected[task.task_name] = entry["rejected"]
        decisions.save(key, entry)  # one kernel at a time: an interrupted run keeps the rest
    return {"kernels": len(todo), "records_chosen": sorted(k for k, c in chosen.items() if c != "default"),
            "default_chosen": sorted(k for k, c in chosen.items() if c == "default"),
            "records_not_used": rejected, "tuned_at": sizes, "checked_at": checks}


def _choose_one(name: str, func: tirx.PrimFunc, found: list[tuple[dict, str]], traces: dict[str, list],
                store: RecordStore, target: Target, checks: list[dict], sizes: list[dict],
                representative: dict[str, int]) -> dict:
    """The entry of one dynamic kernel: its schedule chosen among its default and its instances' records."""
    default = Candidate("default", default_schedule(func, target, representative)[0])
    candidates, rejected, origins = [default], {}, {}
    for own, key in found:
        if key not in traces:
            continue  # that instance's default won its selection
        label = "record at " + ",".join(f"{d}={s}" for d, s in sorted(own.items()))
        try:
            candidates.append(Candidate(label, relaxed_record(func, traces[key], own, store, key)))
            origins[label] = (traces[key], own, key)
        except DoesNotReplay as err:
            rejected[label] = str(err)
    if len(candidates) > 1:
        rejected.update(_disagreeing(candidates, func, target, checks))
    candidates = [c for c in candidates if c.label not in rejected]
    measured = _timed(candidates, func, target, sizes, name) if len(candidates) > 1 else {}
    best = min(measured, key=measured.get, default="default")
    if measured and measured["default"] <= measured[best] * (1 + TOLERANCE):  # a tie keeps the rule's schedule
        best = "default"
    for label, why in rejected.items():
        log.info("%s: %s not used: %s", name, label, why)
    record, own, key = origins.get(best, (None, None, None))
    return {"task": name, "choice": best, "record": record, "sizes": own, "static": key, "ms": measured,
            "rejected": rejected, "measured_at": sizes if measured else [], "checked_at": checks if origins else [],
            "tolerance": TOLERANCE, "measured_on": time.strftime("%Y-%m-%d %H:%M:%S")}


def _disagreeing(candidates: list[Candidate], func: tirx.PrimFunc, target: Target,
                 checks: list[dict]) -> dict[str, str]:
    """The candidates after the first (the default) whose outputs differ from its at one of ``checks``."""
    found: dict[str, str] = {}
    for check in checks:
        values = arguments_at(func, check)
        want = _outputs(candidates[0].schedule, target, values)
        for candidate in candidates[1:]:
            if candidate.label not in found and not _agrees(_outputs(candidate.schedule, target, values), want):
                found[candidate.label] = f"differs from the default schedule at {check}"
    return found


def _timed(candidates: list[Candidate], func: tirx.PrimFunc, target: Target, sizes: list[dict],
           name: str) -> dict[str, float]:
    """Each candidate's milliseconds summed over one call at each of ``sizes`` (those that build)."""
    totals: dict[str, float] = {}
    for assignment in sizes:
        for candidate in measure(candidates, func, target, name=name, values=arguments_at(func, assignment)):
            totals[candidate.label] = totals.get(candidate.label, 0.0) + candidate.ms
    return {label: round(ms, 4) for label, ms in totals.items()}


def apply_dynamic(mod: tvm.IRModule, store: RecordStore) -> tuple[tvm.IRModule, dict[str, str], dict[str, str]]:
    """``mod`` with each kernel of dynamic extents whose entry in ``dynamic.json`` chose a record
    scheduled by it (relaxed); how each kernel with an entry was decided (``RECORD`` or
    ``DEFAULT``), and why each record that no longer applies failed (its kernel keeps its default
    schedule)."""
    entries = DecisionStore(store, "dynamic").load()
    if not entries:
        return mod, {}, {}
    result, sources, failed = mod.clone(), {}, {}
    for gv, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc) or not dims_used(func):
            continue
        kernel = tvm_internals.kernel_module(func)
        entry = entries.get(workload_hash(kernel))
        if entry is None:
            continue
        if entry.get("record") is None:
            sources[gv.name_hint] = DEFAULT
            continue
        try:
            sch = relaxed_record(kernel["main"], entry["record"], entry["sizes"], store, entry["static"])
        except (DoesNotReplay, KeyError, TypeError) as err:
            failed[gv.name_hint] = str(err)
            continue
        result[gv] = sch.mod["main"].with_attrs(func.attrs).with_attr(IS_SCHEDULED, True)
        sources[gv.name_hint] = RECORD
    return result, sources, failed

