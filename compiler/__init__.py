"""relaxc: a deployment compiler for ONNX models on Apache TVM's Relax IR.

    import relaxc
    art = relaxc.compile("onnx:resnet50", target="cpu")
    outputs = art.run(x)              # numpy in, numpy out
    art.export("resnet50.so")         # + resnet50.json manifest
    dep = relaxc.load("resnet50.so")

The package is the repository's ``compiler/`` folder; ``support/``, ``passes/``, ``schedules/`` and
``benchmarks/`` install under it (``relaxc.passes`` ...). ``relaxc.load`` needs only TVM's runtime; the ONNX importer and the pipeline are imported on the
first call to ``compile``. Importing relaxc changes nothing in the process: TVM's thread-pool
defaults are set when a compile starts or an artifact is loaded (``support/threads.py``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from relaxc.runtime.runner import Deployed, load
from relaxc.support.errors import (ExportError, InputError, ModelError, ShapeError, TargetError,
                                   UnsupportedOperatorError, UserError)

if TYPE_CHECKING:
    from typing import Sequence

    from relaxc.build.artifact import Artifact
    from relaxc.frontend import Constants, DimBounds, ModelLike, Shapes
    from relaxc.build.options import Options, TuneOptions
    from relaxc.support.targets import TargetLike

__all__ = ["compile", "tune", "save_cache", "load_cache", "load", "Artifact", "Options", "TuneOptions", "Deployed",
           "UserError", "ModelError", "UnsupportedOperatorError", "ShapeError", "TargetError", "InputError",
           "ExportError"]


def compile(model: "ModelLike", *, target: "TargetLike" = "cpu", shapes: "Shapes | None" = None,  # noqa: A001
            constants: "Constants | None" = None, dim_bounds: "DimBounds | None" = None,
            max_length: int | None = None, max_batch: int | None = None, kv_inputs: "Sequence[str] | None" = None,
            kv_outputs: "Sequence[str] | None" = None, all_logits: bool = False, **options: Any) -> "Artifact":
    """Compile an ONNX model for a target and return a runnable ``Artifact``.

    model: path to ``.onnx``, ``bytes``, ``onnx.ModelProto``, or ``"onnx:<name>"`` (bundled).
    target: ``"cpu"`` (this machine), ``"llvm"``, ``"cuda"`` (the visible GPU's arch, else sm_80;
        ``"cuda:sm_90"`` to choose), ``"rocm"`` (gfx90a; ``"rocm:gfx942"``), a JSON dict or a
        ``tvm.target.Target``. GPU targets cross-compile here; running needs the GPU.
    shapes: binds dynamic input dims, e.g. ``{"input": (1, 3, 224, 224)}``.
    dim_bounds: keeps the other dynamic dims dynamic, each by its name in the model up to a bound,
        e.g. ``{"batch": 32, "sequence": 512}``: one artifact runs every size within them.
    constants: inputs fixed at compile time, e.g. ``{"axes": np.array([1])}``: each becomes a constant
        of the model and is no longer an input of the artifact (for inputs that must be static: a
        reduction's axes, pads, a Reshape's shape).
    max_length: compile a decoder with past (docs/generation.md) to generate up to this many tokens,
        prompt included: the artifact gets ``generate`` and ``session``. ``max_batch`` (default 1)
        sequences at once; ``kv_inputs`` / ``kv_outputs`` name its past inputs and present outputs in
        pairs where they are not ``past_key_values.<i>.key/value`` and ``present.<i>.key/value``;
        ``all_logits`` keeps every prompt position's logits (``session().append(ids, all_positions=True)``),
        where generation needs the last position's alone.
    options: the fields of ``relaxc.Options`` as keywords, each documented there (and in docs/api.md).
    """
    started = time.perf_counter()  # the compile's wall time: on a process's first, the compile side's import
    from relaxc.build.options import Options
    from relaxc.build.pipeline import compile_model

    given = {"max_batch": max_batch, "kv_inputs": kv_inputs, "kv_outputs": kv_outputs,
             "all_logits": all_logits or None}
    generation = {name: value for name, value in given.items() if value is not None}
    if max_length is None and generation:
        raise UserError(f"{', '.join(generation)} describe a decoder to generate with: give max_length too")
    decoder = None if max_length is None else {"max_length": max_length, **generation}
    return compile_model(model, target, shapes, Options(**options), constants, dim_bounds, started, decoder)


def tune(model: "ModelLike", *, target: "TargetLike" = "cpu", shapes: "Shapes | None" = None,
         constants: "Constants | None" = None, dim_bounds: "DimBounds | None" = None,
         tune_sizes: "dict[str, list[int]] | None" = None, **options: Any) -> dict:
    """Tune the model's kernels with MetaSchedule (XGBoost cost model) into the cache.

    options: the fields of ``relaxc.TuneOptions`` and of ``relaxc.Options`` but ``tuning``, as
    keywords (docs/api.md lists them). Records go to
    ``<cache_dir>/<target key>/`` as they are measured, so an interrupted run loses nothing and a
    rerun resumes. Then each kernel whose records changed (every kernel with ``reselect``; only those
    matching ``kernels``, if given) gets its
    schedule chosen: the default and the best records measured again side by side, the fastest
    winning, or the quickest to build within 3% of it; each timed alone with its weights flushed
    from the caches, or, with ``selection="sequence"``, every kernel inside the model's own
    sequence of calls (``schedules/sequence.py``). Later ``compile`` calls replay the choices.
    Dispatch (``dispatch="replay"``, the default, becomes ``"measure"`` here) measures every
    convolution's candidates first, so the kernels tuned are those the model will run; with
    ``selection="sequence"`` each convolution workload with several accurate candidates is then
    decided by timing them in the model too (``schedules/dispatch_sequence.py``), the kernels of
    the implementations it changes to (those without records) are tuned with the same trials, and
    only then are the schedules selected.
    Returns a summary (tasks, trials, records, selection, minutes, stop reason, dispatch choices).
    ``dim_bounds`` keeps dims dynamic as ``compile`` does; each kernel of dynamic extents is then
    tuned as its static kernel at ``tune_sizes`` (``{"sequence": [16, 128]}``: every combination;
    a dim not named at its bound), and its best record, relaxed onto the dynamic extents, checked
    against the default schedule at sizes from 1 to the bounds, replaces that default only where
    it is faster over those sizes together (``schedules/dynamic_tuning.py``).
    """
    from relaxc.build.tuning import tune_model

    return tune_model(model, target, shapes, constants, options, dim_bounds, tune_sizes)


def save_cache(path: str, cache_dir: str | None = None) -> str:
    """Archive the cache ``cache_dir`` (default: the user's, ``$RELAXC_CACHE_DIR`` or
    ``~/.cache/relaxc``; never the stores relaxc ships) to ``path`` (.tar.gz), every file of every
    target's store: tuning records, selections, measured decisions (docs/cache.md), to carry them
    to another machine or CI."""
    from relaxc.schedules import cache, maintenance

    return maintenance.save(path, cache.cache_root(cache_dir))


def load_cache(path: str, cache_dir: str | None = None) -> dict[str, int]:
    """Merge an archive from ``save_cache`` into the cache ``cache_dir`` (a decision or selection
    already there stays); returns the records added per target key. Compiles replay them from then on."""
    from relaxc.schedules import cache, maintenance

    return maintenance.load(path, cache.cache_root(cache_dir))


def __getattr__(name: str) -> Any:
    """``Artifact``, ``Options`` and ``TuneOptions`` on first use: they import the compile side (the
    passes and schedules, code generation), which loading an artifact never needs."""
    if name == "Artifact":
        from relaxc.build import artifact

        return artifact.Artifact
    if name in ("Options", "TuneOptions"):
        from relaxc.build import options

        return getattr(options, name)
    raise AttributeError(f"module 'relaxc' has no attribute {name!r}")
