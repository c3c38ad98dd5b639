"""relaxc: a deployment compiler for ONNX models on Apache TVM's Relax IR.

    import compiler
    art = compiler.compile("onnx:resnet50", target="cpu")
    outputs = art.run(x)              # numpy in, numpy out
    art.export("resnet50.so")         # + resnet50.json manifest
    dep = compiler.load("resnet50.so")

``compiler.load`` needs only TVM's runtime; the ONNX importer and the pipeline are imported on the
first call to ``compile``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from compiler.targets import physical_cores

# TVM's default thread count is half the logical CPUs (to skip hyper-threads): one thread on a
# 2-core VM without SMT, which ran ResNet-50 in 171 ms instead of 96. Use the physical cores unless
# the user chose; TVM reads this when its thread pool starts, at the first run.
if not os.environ.get("TVM_NUM_THREADS") and not os.environ.get("OMP_NUM_THREADS"):
    os.environ["TVM_NUM_THREADS"] = str(physical_cores())
# TVM pins each thread of its pool to a core by default. On this project's 2-vCPU VMs that made
# tuned ResNet-50 slower and erratic (median 55-64 ms, runs from 49 to 72) against 48-50 ms
# unpinned (docs/benchmarks.md); the user's own setting wins.
os.environ.setdefault("TVM_BIND_THREADS", "0")

from compiler.artifact import Deployed, load  # noqa: E402
from compiler.errors import (ExportError, InputError, ModelError, ShapeError, TargetError,  # noqa: E402
                             UnsupportedOperatorError, UserError)

if TYPE_CHECKING:
    from compiler.artifact import Artifact
    from compiler.frontend import ModelLike, Shapes
    from compiler.targets import TargetLike

__all__ = ["compile", "tune", "save_cache", "load_cache", "load", "Deployed", "UserError", "ModelError", "UnsupportedOperatorError",
           "ShapeError", "TargetError", "InputError", "ExportError"]


def compile(model: "ModelLike", *, target: "TargetLike" = "cpu", shapes: "Shapes | None" = None,  # noqa: A001
            tuning: str = "replay", cache_dir: str | None = None,
            layout_block: int | None = None, memory_planner: str | None = None, unshared=(),
            validate_memory: bool = False) -> "Artifact":
    """Compile an ONNX model for a target and return a runnable ``Artifact``.

    model: path to ``.onnx``, ``bytes``, ``onnx.ModelProto``, or ``"onnx:<name>"`` (bundled).
    target: ``"cpu"`` (this machine), ``"llvm"``, ``"cuda"`` (the visible GPU's arch, else sm_80;
        ``"cuda:sm_90"`` to choose), ``"rocm"`` (gfx90a; ``"rocm:gfx942"``), a JSON dict or a
        ``tvm.target.Target``. GPU targets cross-compile here; running needs the GPU.
    shapes: binds dynamic input dims, e.g. ``{"input": (1, 3, 224, 224)}``.
    tuning: ``"replay"`` (default: apply the records there are, default schedules for the rest),
        ``"strict"`` (fail naming every kernel without a record), ``"tune"`` (tune what is missing,
        then build) or ``"off"`` (default schedules only).
    cache_dir: root of the tuning records (default: ``$RELAXC_CACHE_DIR``, else ``./tuning_logs``).
    layout_block: channel block b of the blocked NCHW{b}c layout; default: the target's fp32 vector
        lanes (8 with AVX2, 16 with AVX-512) on CPU, 0 (NCHW) on GPU; 0 keeps every operator in NCHW.
    memory_planner: ``"arena"`` (CPU default: every intermediate at an offset of one arena) or
        ``"tvm"`` (TVM's StaticPlanBlockMemory; GPU default and only choice so far); on CPU
        ``report()["memory"]`` compares both.
    unshared: glob patterns of kernel names (see ``report()["memory"]["tensors"]``) whose outputs
        get bytes of their own, never reused (a subgraph that plans its own memory).
    validate_memory: check the plan pair by pair and fill the arena with garbage before each run.
    """
    from compiler.pipeline import compile_model

    return compile_model(model, target=target, shapes=shapes, tuning=tuning, cache_dir=cache_dir,
                         layout_block=layout_block, memory_planner=memory_planner, unshared=unshared,
                         validate_memory=validate_memory)


def tune(model: "ModelLike", *, target: "TargetLike" = "cpu", trials: int = 2000,
         trials_per_task: int | None = None, minutes: float | None = None, cache_dir: str | None = None,
         shapes: "Shapes | None" = None, layout_block: int | None = None, reselect: bool = False,
         kernels: tuple[str, ...] | list[str] = ()) -> dict:
    """Tune the model's kernels with MetaSchedule (XGBoost cost model) into the record store.

    trials: total measurement budget (0: tune nothing, only select); trials_per_task: per kernel
    (default: an even share, at least 64); minutes: stop tuning when the time is spent. Records go
    to ``<cache_dir>/<target key>/`` as they are measured, so an interrupted run loses nothing and
    a rerun resumes. Then each kernel whose records changed (every kernel with ``reselect``) gets
    its schedule chosen: the default and the best records measured again side by side, the
    fastest winning, or the quickest to build within 3% of it. Later ``compile`` calls replay
    the choices. ``kernels``: glob patterns of the kernels to tune (default: all; names as in
    ``report()["tuning"]``). Returns a summary (tasks, trials, records, selection, minutes, stop reason).
    """
    from compiler.pipeline import compile_model
    from schedules.tuning import tune_module

    art = compile_model(model, target=target, shapes=shapes, tuning="off", layout_block=layout_block)
    if art.target.kind.name != "llvm":
        from compiler.artifact import open_device

        open_device(art.target.kind.name)  # tuning measures on the device: refuse clearly without one
    return tune_module(art.module("fuse"), art.target, trials=trials, trials_per_task=trials_per_task,
                       minutes=minutes, cache_dir=cache_dir, fingerprint=art.fingerprint,
                       model=art.report()["model"], reselect=reselect, kernels=tuple(kernels))


def save_cache(path: str, cache_dir: str | None = None) -> str:
    """Archive the tuning records under ``cache_dir`` (default ``$RELAXC_CACHE_DIR`` or
    ``./tuning_logs``) to ``path`` (.tar.gz), to carry them to another machine or CI."""
    from schedules import cache

    return cache.save(path, cache.cache_root(cache_dir))


def load_cache(path: str, cache_dir: str | None = None) -> dict[str, int]:
    """Merge an archive from ``save_cache`` into the records under ``cache_dir``; returns the
    records added per target key. Compiles replay them from then on."""
    from schedules import cache

    return cache.load(path, cache.cache_root(cache_dir))
