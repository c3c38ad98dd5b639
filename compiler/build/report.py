"""The compile report: what ``Artifact.report()`` holds, and the text view of its memory part.

The reporting passes write their own parts (``support/reporting.py``); this module adds what the
pipeline knows: model, target, fingerprint, versions and signature; the phases' seconds come from
``compiler/build/instrument.py``.
"""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Sequence

from relaxc.runtime.runner import spec_json
from relaxc.support import targets
from relaxc.support.cache_layout import CacheLayout
from relaxc.support.versions import fingerprint, versions

if TYPE_CHECKING:
    import tvm

    from relaxc.build.pipeline import Compilation

TOP = 8  # biggest tensors listed in the summary


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


def memory_summary(memory: dict, decoder: dict | None = None) -> str:
    """What the planner allocated against the bounds, and the biggest tensors with their lifetimes;
    a decoder's cache too, which each session allocates beside the arena."""
    arena, bound = memory["arena_bytes"], memory["lower_bound_bytes"]
    lines = [
        f"planner {memory['planner']}: {mib(arena)} for {len(memory['tensors'])} intermediate tensors",
        f"  lower bound (most bytes live at once)  {mib(bound)}"
        + (f"  (arena is {arena / bound:.3f}x)" if bound else ""),
        f"  TVM StaticPlanBlockMemory               {mib(memory['tvm_static_plan_bytes'])}",
        f"  no reuse (every tensor its own bytes)   {mib(memory['no_reuse_bytes'])}",
        f"  outputs outside the arena: {', '.join(memory['outputs']) or 'none'}",
    ]
    if decoder is not None and "cache" in decoder:
        cache = CacheLayout.from_json(decoder["cache"])
        lines.append(f"  key/value cache per session, outside the arena: {mib(cache.bytes(decoder['max_batch']))} at "
                     f"most ({len(cache.pasts)} x [{decoder['max_batch']}, {cache.heads}, {cache.rows}, {cache.dim}] "
                     f"{cache.dtype})")
    if memory.get("unshared"):
        lines.append(f"  unshared kernels: {', '.join(memory['unshared'])}")
    biggest = sorted(memory["tensors"], key=lambda t: -t["bytes"])[:TOP]
    if biggest:
        lines.append("  biggest tensors (bytes, offset, live bindings, kernel):")
        lines += [f"    {t['name']:>10} {t['bytes']:>10} @ {t['offset']:>10}  [{t['first']}, {t['last']}]  {t['kernel']}"
                  for t in biggest]
    return "\n".join(lines)


def dispatch_summary(dispatch: dict) -> str:
    """Each convolution's candidates with their measured cost and error, the choice and its source,
    and the times in a model's sequence that decided it, where there are some."""
    lines = [f"dispatch: {', '.join(f'{n} {name}' for name, n in dispatch['choices'].items()) or 'no candidates'}"
             f" ({', '.join(f'{n} {source}' for source, n in dispatch['sources'].items())})"]
    for conv in dispatch["convolutions"]:
        measured = conv.get("candidates", {})
        costs = "  ".join(f"{name} {c['ms']:.3f} ms (err {c['error']:.1e})" for name, c in measured.items())
        lines.append(f"  {conv['workload']:48s} -> {conv['choice']:9s} [{conv['source']}]  {costs}")
        if "in_sequence" in conv:
            seq = conv["in_sequence"]
            times = "  ".join(f"{name} {ms:.3f} ms" for name, ms in seq["ms"].items())
            lines.append(f"  {'':48s}    in sequence ({seq['model']}, chose {seq['choice']}): {times}")
    return "\n".join(lines)


def runs_on(backends: dict) -> str:
    """Which runtime runs the model, in words, from ``report()["backends"]``: "relaxc", "relaxc +
    onnxruntime (12 nodes)", or "onnxruntime (whole model)" where TVM's importer refused it."""
    if "whole_model_because" in backends:
        return f"{backends['subgraphs'][0]['backend']} (whole model)"
    nodes: dict[str, int] = {}
    for sub in backends.get("subgraphs", []):
        nodes[sub["backend"]] = nodes.get(sub["backend"], 0) + sub["nodes"]
    return " + ".join(["relaxc", *(f"{name} ({n} nodes)" for name, n in nodes.items())])


def plan_summary(backends: dict) -> str:
    """The partition: each external subgraph and why it is there, and the measured times."""
    subgraphs = backends.get("subgraphs", [])
    lines = [f"backends {backends.get('mode', 'off')}: "
             + (f"{len(subgraphs)} external subgraph(s), the rest on relaxc" if subgraphs else "all on relaxc")
             + (f" (installed: {', '.join(backends['installed'])})" if backends.get("installed") else "")]
    for index, sub in enumerate(subgraphs):
        ops = ", ".join(f"{n} {op}" for op, n in sorted(sub["ops"].items(), key=lambda kv: -kv[1]))
        serves = f"the whole model where the dynamic dims' product is {sub['serves'][0]}..{sub['serves'][1] - 1}; " \
            if "serves" in sub else ""
        lines.append(f"  {index}: {sub['backend']:11s} {sub['placement']:5s} {sub['nodes']:4d} nodes ({ops}); "
                     f"{serves}{sub['boundary_bytes']} bytes out; {sub['why']}")
    if "decision" in backends:
        lines.append(f"  decision: {backends['decision']}"
                     + (f" (strategy {backends['strategy']})" if "strategy" in backends else ""))
    if backends.get("tied"):
        lines.append(f"    tied: {' and '.join(backends['tied'])} (95 % range of their ratio holds 1; "
                     "a mixed plan yields to one backend)")
    for size, choice in backends.get("decision_by_size", {}).items():
        lines.append(f"    at {size}: {choice}")
    memory = backends.get("measured_memory_bytes", {})
    for name, ms in backends.get("measured_ms", {}).items():
        grew = f" {memory[name] / 2**20:8.1f} MiB" if name in memory else ""
        lines.append(f"    measured {name:20s} {ms:9.3f} ms{grew}")
    for segment in backends.get("segments", []):
        first, stop = segment["nodes"]
        times = "  ".join(f"{name} {ms:.3f}" for name, ms in segment["ms"].items()) or "not measured (budget)"
        lines.append(f"    segment nodes {first:4d}-{stop - 1:<4d} alone (ms): {times}")
    if backends.get("segment_sums"):
        sums = backends["segment_sums"]
        lines.append("    segments summed (ms): " + "  ".join(f"{name} {ms:.3f}" for name, ms in sums.items()))
    if backends.get("unmeasured_segments"):
        lines.append(f"  {backends['unmeasured_segments']} segment(s) not measured within the budget: on relaxc")
    if backends.get("whole_model_because"):
        lines.append(f"  whole model external because relaxc failed: {backends['whole_model_because']}")
    return "\n".join(lines)


def tune_command(model: str, target: dict, shapes: Sequence[tuple[str, Sequence[int]]] = (),
                 cache_dir: str | None = None, constants: Sequence[tuple[str, str]] = (),
                 dim_bounds: dict[str, int] | None = None) -> str:
    """The ``relaxc tune`` command that fills the store of the cache this compile read, for this target
    (``constants``: the ``--constant`` NAME=FILE pairs of the compile; a dynamic model's dims are
    tuned at their bounds unless ``--tune-sizes`` names others)."""
    words = ["relaxc", "tune", model, "-t", json.dumps(_target_flags(target), separators=(",", ":"))]
    words += [f"--shape={name}={','.join(str(d) for d in dims)}" for name, dims in shapes]
    words += [f"--constant={name}={path}" for name, path in constants]
    words += [f"--dim-bound={name}={bound}" for name, bound in (dim_bounds or {}).items()]
    if cache_dir:
        words += ["--cache-dir", cache_dir]
    return shlex.join(words)


def _target_flags(target: dict) -> dict:
    return {k: v for k, v in target.items() if v not in ("", None) and k not in ("tag", "keys")}


def summary(report: dict, tune_with: str | None = None, latency: str | None = None) -> str:
    """The report on one screen: phases, layout, memory, schedules and tuning, warnings, latency.
    ``tune_with`` is the command that would tune the kernels without records."""
    # the phases that print as 0.1 s or more: all fourteen would not fit one line
    phases = " · ".join(f"{p['name']} {p['seconds']:.1f}" for p in report["phases"] if p["seconds"] >= 0.05)
    layout, memory = report.get("layout", {}), report.get("memory", {})
    lines = [
        f"{report['model']} for {report['target'].get('kind')} "
        f"({', '.join(f'{k}={v}' for k, v in _target_flags(report['target']).items() if k != 'kind')})",
        f"  compiled in {report['compile_seconds']:.1f} s: "
        + (f"{phases} (s; the others under 0.05)" if phases else "each phase under 0.05 s"),
        f"  fingerprint {report['fingerprint'][:16]}",
    ]
    if layout:
        padded = layout.get("padded_tensors", [])
        lines.append(f"  layout: NCHW{layout['block']}c ({layout['why']}): {layout['blocked_ops']} ops blocked, "
                     f"{layout['standard_ops']} standard ({_kinds(layout.get('standard_op_kinds', {}))}), "
                     f"{layout['converters']} converters, {len(padded)} tensors padded "
                     f"({mib(layout['padding_bytes'])})")
    if memory:
        bound = memory["lower_bound_bytes"]
        lines.append(f"  memory: arena {mib(memory['arena_bytes'])} for {len(memory['tensors'])} tensors, "
                     + (f"{memory['arena_bytes'] / bound:.3f}x the lower bound, " if bound else "")
                     + f"TVM's own plan {mib(memory['tvm_static_plan_bytes'])}")
    schedules, tuning = report.get("schedules", {}), report.get("tuning", {})
    lines.append(f"  kernels: {_kinds(schedules)}")
    if tuning:
        tasks, covered = tuning.get("tasks", 0), tuning.get("tasks_with_records", 0)
        lines.append(f"  tuning {tuning['mode']}: {covered} of {tasks} kernels have records "
                     f"in {tuning.get('cache_dir')}" + (f" or relaxc's {tuning['shipped']}" if tuning.get("shipped") else ""))
        if "stores" in tuning:  # no store for this target there
            lines.append(f"    no records for this CPU there (stores: {', '.join(tuning['stores']) or 'none'})")
        if covered < tasks and tune_with:
            lines.append(f"    to tune the {tasks - covered} others on this CPU: {tune_with}")
    backends = report.get("backends", {})
    subgraphs = [s for s in backends.get("subgraphs", []) if "serves" not in s]
    if subgraphs:
        lines.append(f"  backends: {len(subgraphs)} external subgraph(s) on "
                     f"{', '.join(sorted({s['backend'] for s in subgraphs}))}, "
                     f"{sum(s['nodes'] for s in subgraphs)} nodes (relaxc inspect --plan)")
    if "decision_by_size" in backends:
        lines.append("  backends by size: " + "; ".join(f"{choice} at {size}" for size, choice in
                                                        backends["decision_by_size"].items()) + " (relaxc inspect --plan)")
    for warning in report.get("warnings", []):
        lines.append(f"  warning: {warning}")
    if latency:
        lines.append(f"  latency: {latency}")
    return "\n".join(lines)


def _kinds(counts: dict) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"


def assemble(compilation: "Compilation", snapshots: "dict[str, tvm.IRModule]") -> dict:
    """The report of a finished compile, but for its phases' seconds (``compiler/build/instrument.py``)."""
    config, model = compilation.config, compilation.model
    backend_versions = compilation.report.get("backends", {}).get("versions", {})
    # what the external backends run (their weights too) is in their slices, not in relaxc's module
    slices = {"external": [f"{sub.function} {sub.tail} {sub.serves}" for sub in model.subgraphs]} \
        if model.subgraphs else {}
    return {
        "model": model.name,
        "target": targets.describe(config.target),
        "fingerprint": fingerprint(snapshots["fuse"], config.target, config.fingerprint_options(),
                                   {**config.tools, **backend_versions, **slices}, weights=snapshots["import"]),
        "versions": {**versions(), **config.tools, **backend_versions},
        "inputs": [spec_json(s, model.input_high.get(s[0])) for s in model.inputs],
        "outputs": [spec_json(s) for s in model.outputs],
        "dim_bounds": model.dim_bounds,
        "empty_dims": list(compilation.prepared.empty_dims),
        "ops": model.ops,
        **compilation.report,
    }
