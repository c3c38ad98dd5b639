"""The compile report: what ``Artifact.report()`` holds, and the text view of its memory part.

The reporting passes write their own parts (``support/reporting.py``); this module adds what the
pipeline knows: model, target, fingerprint, versions, signature and phase timings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from support import targets
from support.versions import fingerprint, versions

if TYPE_CHECKING:
    from compiler.runtime import TensorSpec
    from compiler.instrument import PhaseRecorder
    from compiler.pipeline import Compilation

TOP = 8  # biggest tensors listed in the summary


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


def memory_summary(memory: dict) -> str:
    """What the planner allocated against the bounds, and the biggest tensors with their lifetimes."""
    arena, bound = memory["arena_bytes"], memory["lower_bound_bytes"]
    lines = [
        f"planner {memory['planner']}: {mib(arena)} for {len(memory['tensors'])} intermediate tensors",
        f"  lower bound (most bytes live at once)  {mib(bound)}"
        + (f"  (arena is {arena / bound:.3f}x)" if bound else ""),
        f"  TVM StaticPlanBlockMemory               {mib(memory['tvm_static_plan_bytes'])}",
        f"  no reuse (every tensor its own bytes)   {mib(memory['no_reuse_bytes'])}",
        f"  outputs outside the arena: {', '.join(memory['outputs']) or 'none'}",
    ]
    if memory.get("unshared"):
        lines.append(f"  unshared kernels: {', '.join(memory['unshared'])}")
    biggest = sorted(memory["tensors"], key=lambda t: -t["bytes"])[:TOP]
    if biggest:
        lines.append("  biggest tensors (bytes, offset, live bindings, kernel):")
        lines += [f"    {t['name']:>10} {t['bytes']:>10} @ {t['offset']:>10}  [{t['first']}, {t['last']}]  {t['kernel']}"
                  for t in biggest]
    return "\n".join(lines)


def assemble(compilation: "Compilation", recorder: "PhaseRecorder") -> dict:
    """The whole report of a finished compile."""
    config, model = compilation.config, compilation.model
    return {
        "model": model.name,
        "target": targets.describe(config.target),
        "fingerprint": fingerprint(recorder.snapshots["fuse"], config.target, config.fingerprint_options(),
                                   config.tools),
        "versions": {**versions(), **config.tools},
        "inputs": [_spec_json(s) for s in model.inputs],
        "outputs": [_spec_json(s) for s in model.outputs],
        "phases": recorder.timings,
        "compile_seconds": recorder.seconds,
        "ops": model.ops,
        **compilation.report,
    }


def _spec_json(spec: "TensorSpec") -> dict:
    name, shape, dtype = spec
    return {"name": name, "shape": list(shape), "dtype": dtype}
