"""The compilation pipeline: every phase, in order, from an ONNX model to a built artifact.

    import     compiler/frontend/          validate the ONNX model, expand function operators, fold shape
                                           computations, rewrite ignored attributes, refuse inexact
                                           forms, convert to Relax
    simplify   passes/signed_activations.py int8 activations held as uint8 ones, 128 higher
               passes/quantized.py         quantized (QDQ) convolutions, matmuls, additions to integer arithmetic
               passes/fold_constants.py    half types accumulate in float32, fold constants and batch norms,
               passes/integer_matmul.py    MatMulInteger on uint8 x int8 bytes
               passes/cse.py               canonicalize, CSE (weights compared by object), dead code
    layout     passes/layout_choice.py     (layouts="measure"/"replay") each op's layout, converters costed
               passes/layout.py            NCHW convs to blocked NCHW{b}c, channels padded to the block
               passes/attention.py         a dynamic key length padded to whole vectors in attention
               passes/dense.py             constant matmul weights packed into column panels
    dispatch   passes/dispatch.py          each 3x3 conv: direct or Winograd, as measured (schedules/dispatch.py)
    legalize   passes/legalize.py          Relax operators to TIR PrimFuncs (blocked convs: ours)
    fuse       TVM FuseOps/FuseTIR         fuse producers with their elementwise consumers, reshapes as views
    tune       schedules/tuning.py         apply tuning records (replay, strict) or tune first (tune)
    schedule   schedules/default.py        default schedule rules for every kernel without a record
               passes/positive_dims.py     kernels told a dynamic dim is at least 1
    lower      passes/memory.py + TVM      VM lowering, arena storage planning on the final shapes
               passes/shape_reuse.py       a dynamic model's shapes built once per call
    build      compiler/codegen/parallel.py code generation, CPU kernels on every core
               (exp, tanh, erf, pow lowered to vector polynomials: passes/fast_math.py)

Each phase is timed and the module after it is kept (``compiler/instrument.py``), so
``Artifact.ir(phase)`` shows what it did; passes that report write their own part of
``Artifact.report()`` (``support/reporting.py``). docs/design.md says why the phases come in this order.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Callable

import tvm
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as cpu_generic
from tvm.relax.backend.cuda import pipeline as cuda_pipeline
from tvm.relax.backend.rocm import pipeline as rocm_pipeline

from relaxc import backend_choice, diagnostics, external, frontend, report
from relaxc.artifact import Artifact
from relaxc.codegen import parallel
from relaxc.instrument import PhaseRecorder
from relaxc.options import Config, Options
from relaxc.passes import fast_math
from relaxc.passes.attention import PadAttentionKeys
from relaxc.passes.dense import PackDenseWeights
from relaxc.passes.dispatch import Dispatch
from relaxc.schedules.cache import LAYOUT_FILE, store_for
from relaxc.schedules.dispatch import Chooser, DispatchStore, MeasuredLayoutCosts
from relaxc.passes.channels_last import ChannelsLastToNCHW
from relaxc.passes.canonicalize import (ChannelShuffleToTake, ClipFromTIR, Conv1dAsConv2d, DepthwisePointwiseToMultiply,
                                 DivideByConstantToMultiply, DropoutToIdentity, GroupNormAsRows, MatmulOfFlattenedRows,
                                 SplitAlongChannelsToSlices, SumOfStackToAdd, WholeReductionsInSlabs)
from relaxc.passes.check_indices import CheckIndices
from relaxc.passes.conv_taps import DropPaddingTaps
from relaxc.passes.cse import EliminateCommonSubexpr
from relaxc.passes.fold_constants import FoldConstantsNumpy, FoldRemainingConstants
from relaxc.passes.half_precision import AccumulateHalfInFloat32
from relaxc.passes import layout_choice
from relaxc.passes.integer_matmul import IntegerMatmuls
from relaxc.passes.layout import LayoutPass
from relaxc.passes.layout_algebra import STANDARD, blocked
from relaxc.passes.legalize import legalize_ops
from relaxc.passes.quantized import QuantizedToIntegers
from relaxc.passes.signed_activations import SignedActivationsAsUnsigned
from relaxc.passes.memory import ArenaPlan
from relaxc.passes.positive_dims import PositiveDims
from relaxc.passes.shape_reuse import ReuseShapes
from relaxc.schedules.default import DefaultSchedules
from relaxc.schedules.tuning import ApplyTuningRecords
from relaxc.support import remote, tvm_log
from relaxc.support.reporting import summaries
from relaxc.support.errors import UserError
from relaxc.support.targets import TargetLike, byte_dot, dynamic_multiple, vector_lanes, vector_registers
from relaxc.support.threads import configure_threads, pool_threads

log = logging.getLogger("relaxc")


@dataclass
class Compilation:
    """What the phases of one compile share: the resolved options, the imported model, and the
    parts of the report the reporting passes have written so far; the external subgraphs' sessions,
    held until the artifact's runner holds them."""

    config: Config
    model: frontend.ImportedModel
    report: dict = field(default_factory=dict)
    sessions: list[external.Session] = field(default_factory=list)


@dataclass(frozen=True)
class Phase:
    name: str
    passes: Callable[[Compilation], list[tvm.transform.Pass]]  # built when the phase starts

    def run(self, mod: tvm.IRModule, compilation: Compilation) -> tvm.IRModule:
        passes = self.passes(compilation)
        # a clone: some passes (TVM's dlight among them) assign into the module they are given,
        # which would rewrite the snapshot of the previous phase
        mod = tvm.transform.Sequential(passes, name=self.name)(mod.clone())
        compilation.report.update(summaries(passes))
        return mod


def _simplify(c: Compilation) -> list[tvm.transform.Pass]:
    dot = byte_dot(c.config.target)
    saturated_pairs = dot is not None and dot.pairs is not None
    return [
        AccumulateHalfInFloat32(),
        SignedActivationsAsUnsigned(),
        QuantizedToIntegers(saturated_pairs),  # before folding: it reads the int8 weights under their dequantize
        FoldConstantsNumpy(),  # materialise fills first: FoldBatchnormToConv2D needs constants
        relax.transform.FoldBatchnormToConv2D(),
        relax.transform.DecomposeOpsForInference(),
        FoldConstantsNumpy(),
        FoldRemainingConstants(),  # TVM's FoldConstant for what the numpy folder does not cover
        IntegerMatmuls(),  # after folding: reads the weights minus their zero point as one constant
        Conv1dAsConv2d(),
        DepthwisePointwiseToMultiply(),
        GroupNormAsRows(),
        WholeReductionsInSlabs(),
        DropPaddingTaps(),  # weights are constants now
        SumOfStackToAdd(),
        SplitAlongChannelsToSlices(),  # before ChannelShuffleToTake: a slice of a shuffle is a take
        ChannelShuffleToTake(),
        ClipFromTIR(),
        DropoutToIdentity(),
        DivideByConstantToMultiply(),
        MatmulOfFlattenedRows(),
        ChannelsLastToNCHW(),
        CheckIndices(c.config.target.kind.name == "llvm", c.model.index_readers, c.model.onnx_names),
        EliminateCommonSubexpr(),  # TVM's, without hashing every weight's bytes
        relax.transform.CanonicalizeBindings(),
        relax.transform.DeadCodeElimination(),
    ]


def _layout(c: Compilation) -> list[tvm.transform.Pass]:
    target = c.config.target
    packing = ([PackDenseWeights(vector_lanes(target), vector_registers(target),
                                 byte_dot(target))]
               if target.kind.name == "llvm" else [])  # GPUs: dlight's matmul rules
    planner = ((lambda mod: _plan_layouts(mod, c)) if target.kind.name == "llvm" and c.config.layout_block >= 4
               and c.config.layouts != "rule" else None)
    attention = [PadAttentionKeys(dynamic_multiple(target))] if target.kind.name == "llvm" else []
    return [LayoutPass(c.config.layout_block, c.config.layout_why, c.model.onnx_names, planner), *attention, *packing]


def _plan_layouts(mod: tvm.IRModule, c: Compilation) -> tuple[dict, dict]:
    """The graph-level layout choice from the times measured for this CPU (``passes/layout_choice.py``):
    the target's block, the other of 8 and 16 lanes (half a block on AVX-512, two vectors on AVX2),
    and NCHW; the layout pass's own choice where a time is missing."""
    config = c.config
    block = config.layout_block
    layouts = [blocked(block), blocked(block * 2 if block < 16 else block // 2), STANDARD]
    store = DispatchStore(store_for(config.cache_dir, config.target), LAYOUT_FILE)
    costs = MeasuredLayoutCosts(config.layouts == "measure", store, lambda m: _build_candidate(m, c))
    choice = layout_choice.choose(mod, layouts, costs)
    if choice is None:
        why = f"not every time is in {store.path}: compile once with layouts='measure' on this CPU"
        log.info("layout choice: the rule, %s", why)
        return {}, {"source": "rule", "why": why}
    return choice.plan, {"source": "measured" if costs.measured else "stored", **choice.summary()}


def _dispatch(c: Compilation) -> list[tvm.transform.Pass]:
    config = c.config
    target = config.target
    if target.kind.name != "llvm":  # GPUs: one implementation per operator so far
        return []
    reads_store = config.dispatch in ("replay", "measure")
    store = DispatchStore(store_for(config.cache_dir, target)) if reads_store else None
    unit = (vector_lanes(target), vector_registers(target))
    chooser = Chooser(config.dispatch, config.strategy, store, lambda mod: _build_candidate(mod, c), *unit,
                      strict=config.tuning == "strict")
    return [Dispatch(chooser, *unit, measurable=reads_store)]


def _build_candidate(mod: tvm.IRModule, c: Compilation) -> relax.VMExecutable:
    """A dispatch candidate's module through the phases after dispatch, as the model's kernels go:
    tuning records replayed (never tuned, never required), default schedules for the rest."""
    tuning = "off" if c.config.tuning == "off" else "replay"
    alone = Compilation(dataclasses.replace(c.config, tuning=tuning), c.model)
    for phase in PHASES[PHASE_NAMES.index("legalize") - 1:]:
        mod = phase.run(mod, alone)
    return parallel.build(mod, c.config.target)


def _legalize(c: Compilation) -> list[tvm.transform.Pass]:
    return [legalize_ops(c.config.target), relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant()]


def _fuse(_c: Compilation) -> list[tvm.transform.Pass]:
    # a reshape left unfused is a view, not a copy (TVM does it after scheduling, when a scheduled
    # reshape no longer reads as one: a dynamic one, which fuses with nothing, copied)
    return [relax.transform.FuseOps(), relax.transform.FuseTIR(), relax.transform.RewriteDataflowReshape(),
            relax.transform.DeadCodeElimination()]


def _tune(c: Compilation) -> list[tvm.transform.Pass]:
    return [ApplyTuningRecords(c.config.tuning, c.config.cache_dir, model=c.model.name)]


def _schedule(c: Compilation) -> list[tvm.transform.Pass]:
    return [DefaultSchedules(c.config.target), PositiveDims()]


TVM_PIPELINES = {"llvm": cpu_generic, "cuda": cuda_pipeline, "rocm": rocm_pipeline}  # TVM's lowering per target kind


def _lower(c: Compilation) -> list[tvm.transform.Pass]:
    target = c.config.target
    tvm_pipeline = TVM_PIPELINES[target.kind.name]
    arena = ArenaPlan(c.config.memory_planner, c.config.unshared, c.config.validate_memory,
                      padding_bytes=c.report.get("layout", {}).get("padding_bytes", 0))  # none: a dispatch candidate
    return (tvm_pipeline.dataflow_lower_passes(target) + [arena] + tvm_pipeline.finalize_passes(target)
            + [ReuseShapes()])


PHASES: tuple[Phase, ...] = (
    Phase("simplify", _simplify),
    Phase("layout", _layout),
    Phase("dispatch", _dispatch),
    Phase("legalize", _legalize),
    Phase("fuse", _fuse),
    Phase("tune", _tune),
    Phase("schedule", _schedule),
    Phase("lower", _lower),
)
PHASE_NAMES = ("import",) + tuple(p.name for p in PHASES) + ("final",)  # Artifact.ir(phase)


def compile_model(model: frontend.ModelLike, target: TargetLike = "cpu", shapes: frontend.Shapes | None = None,
                  options: Options = Options(), constants: frontend.Constants | None = None,
                  dim_bounds: frontend.DimBounds | None = None) -> Artifact:
    """Compile ``model`` for ``target``; see ``relaxc.compile`` for the contract."""
    configure_threads()  # constant folding runs kernels: TVM's thread pool may start right here
    fast_math.register()
    config = options.resolve(target)
    recorder = PhaseRecorder()
    with tvm_log.captured() as said:
        prepared = recorder.run("import", frontend.prepare_model, model, shapes, constants,
                                config.backends == "relaxc", dim_bounds)
    warned, logged = diagnostics.translate(said)
    partitioning, choice = backend_choice.partitioning(
        prepared, config, lambda part, given: _artifact(part, given, config, PhaseRecorder()),
        lambda: frontend.bind_constants(frontend.load_model(model)[0], constants).SerializeToString())
    return _artifact(prepared, partitioning, config, recorder, {"warnings": warned, "tvm_log": logged}, choice)


def _artifact(prepared: frontend.Prepared, partitioning: frontend.Partitioning, config: Config,
              recorder: PhaseRecorder, before: dict | None = None, choice: dict | None = None) -> Artifact:
    """The prepared model compiled with this partition; the whole model on an external backend
    where TVM's importer fails on relaxc's part and one is installed. ``before``: the warnings and TVM log of
    the steps before; ``choice``: how the partition was chosen (``report()["backends"]``)."""
    with tvm_log.captured() as said:
        try:
            compilation, executable = _compile(prepared, partitioning, config, recorder)
        except UserError as err:  # what TVM's importer cannot convert goes to an external backend
            whole = backend_choice.whole_model(prepared, partitioning, err)
            if whole is None:
                raise
            recorder.timings[1:], recorder.snapshots = [], {}
            compilation, executable = _compile(prepared, whole, config, recorder)
            compilation.report["backends"]["whole_model_because"] = f"{type(err).__name__}: {err}"
    warned, logged = diagnostics.translate(said)
    before = before or {"warnings": [], "tvm_log": []}
    compilation.report["warnings"] = before["warnings"] + warned
    compilation.report["tvm_log"] = before["tvm_log"] + logged
    compilation.report["backends"].update(choice or {})
    model = compilation.model
    return Artifact(executable, config.target, model.inputs, model.outputs,
                    report.assemble(compilation, recorder), recorder.snapshots, model.subgraphs,
                    model.program_outputs)


def _compile(prepared: frontend.Prepared, partitioning: frontend.Partitioning, config: Config,
             recorder: PhaseRecorder) -> tuple[Compilation, relax.VMExecutable]:
    """relaxc's part of the model through every phase; its external subgraphs opened first."""
    imported = recorder.run("import", frontend.convert, prepared, partitioning)
    sessions = [external.open_subgraph(sub, pool_threads()) for sub in imported.subgraphs]
    recorder.snapshots["import"] = imported.module
    compilation = Compilation(config, imported, sessions=sessions)
    compilation.report["backends"] = backend_choice.describe(imported, partitioning, config)
    mod = imported.module
    with config.target, remote.measuring_on(config.tracker):
        for phase in PHASES:
            mod = recorder.run(phase.name, phase.run, mod, compilation)
    recorder.snapshots["final"] = mod
    return compilation, recorder.run("build", parallel.build, mod, config.target)
