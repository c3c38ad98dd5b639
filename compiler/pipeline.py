"""The compilation pipeline: every phase, in order, from an ONNX model to a built artifact.

    import     compiler/frontend.py   validate the ONNX model, convert to Relax
    simplify   passes/fold_constants  fold constants and batch norms, CSE, dead code
    layout     passes/layout.py        NCHW convs to blocked NCHW{b}c, channels padded to the block
    legalize   passes/legalize.py      Relax operators to TIR PrimFuncs (blocked convs: ours)
    fuse       TVM FuseOps/FuseTIR     fuse producers with their elementwise consumers
    tune       schedules/tuning.py     apply tuning records (replay, strict) or tune first (tune)
    schedule   schedules/default.py    default schedules for every kernel without a record
    lower      passes/memory.py + TVM  VM lowering, arena storage planning on the final shapes
    build      compiler/codegen.py     code generation, CPU kernels on every core (GPU: tools from compiler/toolchain.py)

Each phase is timed and the module after it is kept, so ``Artifact.ir(phase)`` shows what it did.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from typing import Callable

import tvm
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as cpu_generic
from tvm.relax.backend.cuda import pipeline as cuda_backend
from tvm.relax.backend.rocm import pipeline as rocm_backend
from tvm.target import Target

from compiler import codegen, frontend, targets, toolchain
from compiler.artifact import Artifact
from compiler.errors import TargetError, UserError
from passes.canonicalize import ClipFromTIR, DropoutToIdentity, SumOfStackToAdd
from passes.fold_constants import FoldConstantsNumpy
from passes.layout import LayoutPass
from passes.legalize import legalize_ops
from passes.memory import PLANNERS, ArenaPlan
from schedules import cache
from schedules.cpu import SCHEDULE_ATTR
from schedules.default import apply_default_schedules
from schedules.tuning import MODES as TUNING_MODES
from schedules.tuning import ApplyTuningRecords

log = logging.getLogger("relaxc")


@dataclass(frozen=True)
class Options:
    """Everything besides the model that decides what the pipeline produces (fingerprinted)."""

    target: Target
    layout_block: int  # channel block of NCHW{b}c; 0 keeps NCHW
    memory_planner: str = "arena"  # or "tvm": StaticPlanBlockMemory
    unshared: tuple[str, ...] = ()  # kernels (glob patterns) whose outputs get bytes of their own
    validate_memory: bool = False  # check the plan, fill the arena with garbage before each run
    tuning: str = "replay"  # off | replay | strict | tune
    cache_dir: str | None = None  # root of the tuning records (default: $RELAXC_CACHE_DIR or ./tuning_logs)

    def fingerprint_options(self) -> dict:
        return {"layout_block": self.layout_block, "memory_planner": self.memory_planner,
                "unshared": list(self.unshared), "validate_memory": self.validate_memory}


@dataclass(frozen=True)
class Phase:
    name: str
    passes: Callable[[Options], list[tvm.transform.Pass]]


def _simplify(_options: Options) -> list[tvm.transform.Pass]:
    return [
        FoldConstantsNumpy(),  # materialise fills first: FoldBatchnormToConv2D needs constants
        relax.transform.FoldBatchnormToConv2D(),
        relax.transform.DecomposeOpsForInference(),
        FoldConstantsNumpy(),
        relax.transform.FoldConstant(),  # whatever the numpy folder does not cover
        SumOfStackToAdd(),
        ClipFromTIR(),
        DropoutToIdentity(),
        relax.transform.EliminateCommonSubexpr(),
        relax.transform.CanonicalizeBindings(),
        relax.transform.DeadCodeElimination(),
    ]


def _layout(options: Options) -> list[tvm.transform.Pass]:
    return [LayoutPass(options.layout_block)]


def _legalize(_options: Options) -> list[tvm.transform.Pass]:
    return [legalize_ops(), relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant()]


def _fuse(_options: Options) -> list[tvm.transform.Pass]:
    return [relax.transform.FuseOps(), relax.transform.FuseTIR(),
            relax.transform.DeadCodeElimination()]


def _tune(options: Options) -> list[tvm.transform.Pass]:
    return [ApplyTuningRecords(options.tuning, options.cache_dir)]


def _schedule(options: Options) -> list[tvm.transform.Pass]:
    return [apply_default_schedules(options.target)]


BACKENDS = {"llvm": cpu_generic, "cuda": cuda_backend, "rocm": rocm_backend}


def _lower(options: Options) -> list[tvm.transform.Pass]:
    backend = BACKENDS[options.target.kind.name]
    arena = ArenaPlan(options.memory_planner, options.unshared, options.validate_memory)
    return backend.dataflow_lower_passes(options.target) + [arena] + backend.finalize_passes(options.target)


PHASES: tuple[Phase, ...] = (
    Phase("simplify", _simplify),
    Phase("layout", _layout),
    Phase("legalize", _legalize),
    Phase("fuse", _fuse),
    Phase("tune", _tune),
    Phase("schedule", _schedule),
    Phase("lower", _lower),
)
PHASE_NAMES = ("import",) + tuple(p.name for p in PHASES) + ("final",)


def compile_model(model: frontend.ModelLike, *, target: targets.TargetLike = "cpu",
                  shapes: frontend.Shapes | None = None, tuning: str = "replay",
                  cache_dir: str | None = None, layout_block: int | None = None,
                  memory_planner: str | None = None, unshared: tuple[str, ...] | list[str] = (),
                  validate_memory: bool = False) -> Artifact:
    """Compile ``model`` for ``target``; see ``compiler.compile`` for the contract."""
    if tuning not in TUNING_MODES:
        raise UserError(f"tuning must be one of {', '.join(TUNING_MODES)}, not {tuning!r}")
    tvm_target = targets.resolve(target)
    if tvm_target.kind.name not in BACKENDS:
        raise TargetError(f"target kind {tvm_target.kind.name!r} is not supported; "
                          f"relaxc compiles for {', '.join(BACKENDS)}")
    gpu = targets.is_gpu(tvm_target)
    toolchain_versions = toolchain.prepare(tvm_target.kind.name)  # fails early if a tool is missing
    layout_why = "given by the caller"
    if layout_block is None:
        layout_block, layout_why = ((0, "GPU: NCHW until NCHW, NHWC and blocked are measured on one (docs/gpu.md)")
                                    if gpu else (targets.vector_lanes(tvm_target), "the target's fp32 vector lanes"))
    if layout_block != 0 and layout_block < 2:
        raise UserError(f"layout_block must be 0 (keep NCHW) or at least 2, not {layout_block}")
    if memory_planner is None:
        memory_planner = "tvm" if gpu else "arena"
    if memory_planner not in PLANNERS:
        raise UserError(f"memory_planner must be one of {', '.join(PLANNERS)}, not {memory_planner!r}")
    if gpu and (memory_planner == "arena" or unshared or validate_memory):
        raise UserError("the arena planner (and unshared, validate_memory) is CPU-only so far: its kernels "
                        "take element offsets, never run on a GPU yet; use memory_planner='tvm'")
    options = Options(tvm_target, layout_block, memory_planner, tuple(unshared), validate_memory, tuning,
                      cache_dir)
    timings: list[dict] = []
    snapshots: dict[str, tvm.IRModule] = {}
    summaries: dict[str, dict] = {}

    start = time.perf_counter()
    imported = frontend.import_model(model, shapes)
    mod = imported.module
    timings.append({"name": "import", "seconds": time.perf_counter() - start})
    log.info("import    %6.2fs  %s", timings[-1]["seconds"], imported.name)
    snapshots["import"] = mod

    with tvm_target:
        for phase in PHASES:
            start = time.perf_counter()
            passes = phase.passes(options)
            # a clone: some passes (TVM's dlight among them) assign into the module they are given,
            # which would rewrite the snapshot of the previous phase
            mod = tvm.transform.Sequential(passes, name=phase.name)(mod.clone())
            for pass_ in passes:  # passes that say what they did: their summary joins the report
                summary = getattr(pass_, "summary", None)
                if summary is not None:
                    summaries[pass_.report_key] = summary()
                if getattr(pass_, "error", None) is not None:  # a user error, kept across the FFI
                    raise pass_.error
            timings.append({"name": phase.name, "seconds": time.perf_counter() - start})
            log.info("%-9s %6.2fs", phase.name, timings[-1]["seconds"])
            snapshots[phase.name] = mod
    snapshots["final"] = mod

    start = time.perf_counter()
    executable = codegen.build(mod, tvm_target)
    timings.append({"name": "build", "seconds": time.perf_counter() - start})
    log.info("build     %6.2fs", timings[-1]["seconds"])

    summaries["layout"]["why"] = layout_why
    for padded in summaries["layout"]["padded_tensors"]:  # the user's names, not the C-safe ones
        padded["name"] = imported.onnx_names.get(padded["name"], padded["name"])
    if "memory" in summaries:  # channel padding is known before fusion only: the layout pass counted it
        summaries["memory"]["padding_bytes"] = summaries.get("layout", {}).get("padding_bytes", 0)
    report = {
        "model": imported.name,
        "target": targets.describe(tvm_target),
        "fingerprint": cache.fingerprint(snapshots["fuse"], tvm_target, options.fingerprint_options(),
                                         toolchain_versions),
        "versions": {**cache.versions(), **toolchain_versions},
        "inputs": [_spec_json(s) for s in imported.inputs],
        "outputs": [_spec_json(s) for s in imported.outputs],
        "phases": timings,
        "compile_seconds": sum(t["seconds"] for t in timings),
        "ops": imported.ops,
        "schedules": _schedule_counts(snapshots["schedule"]),
        **summaries,
    }
    return Artifact(executable, tvm_target, imported.inputs, imported.outputs, report, snapshots)


def _schedule_counts(mod: tvm.IRModule) -> dict[str, int]:
    """How many kernels got each kind of schedule: a tuning record ("tuned"), the default schedules
    ("tiled", "basic"), or none."""
    kinds = [_schedule_kind(func) for func in mod.functions.values() if isinstance(func, tvm.tirx.PrimFunc)]
    return dict(sorted(collections.Counter(kinds).items()))


def _schedule_kind(func: tvm.tirx.PrimFunc) -> str:
    attrs = func.attrs or {}
    if SCHEDULE_ATTR in attrs:
        return str(attrs[SCHEDULE_ATTR])
    return "tuned" if attrs.get("tirx.is_scheduled") else "none"


def _spec_json(spec: frontend.TensorSpec) -> dict:
    name, shape, dtype = spec
    return {"name": name, "shape": list(shape), "dtype": dtype}
