"""The compilation pipeline: every phase, in order, from an ONNX model to a built artifact.

    prepare   compiler/frontend/             validate the ONNX model, expand function operators and
                                             QOperators, fold shape computations, rewrite ignored
                                             attributes, write out recurrent layers, refuse inexact forms
    backends  compiler/build/backend_choice.py     which backend runs each node: relaxc, or an installed
                                             library for what relaxc cannot compile or runs slower
              compiler/build/backend_costs.py      (backends="measure": partitions built and timed first,
              compiler/build/backend_candidates.py the whole-model candidates against each other)
    import    compiler/frontend/             the external subgraphs cut out, relaxc's part to Relax
    simplify  passes/half_precision.py       AccumulateHalfInFloat32: half types accumulate in float32
              passes/signed_activations.py   SignedActivationsAsUnsigned: int8 activations as uint8, 128 higher
              passes/quantized/              QuantizedToIntegers: QDQ convs, matmuls, additions on integers
              passes/fold_constants.py       FoldConstantsNumpy, TVM's FoldBatchnormToConv2D and
                                             DecomposeOpsForInference, FoldConstantsNumpy, FoldRemainingConstants
              passes/integer_matmul.py       IntegerMatmuls: MatMulInteger on uint8 x int8 bytes
              passes/canonicalize/           Conv1dAsConv2d, DepthwisePointwiseToMultiply, GroupNormAsRows,
                                             WholeReductionsInSlabs: importer idioms undone
              passes/conv_taps.py            DropPaddingTaps: convolution taps that read only padding
              passes/canonicalize/           SumOfStackToAdd, SplitAlongChannelsToSlices, ChannelShuffleToTake,
                                             ClipFromTIR, DropoutToIdentity, DivideByConstantToMultiply,
                                             MatmulOfFlattenedRows, EmptyConcatOperands
              passes/channels_last.py        ChannelsLastToNCHW: channels-last stretches back into NCHW
              passes/check_indices.py        CheckIndices: gather and scatter indices checked
              passes/cse.py                  EliminateCommonSubexpr, TVM's CanonicalizeBindings and
                                             DeadCodeElimination
    layout    passes/decode.py               DecodeStep: a decoder's one-token step beside main;
                                             LastPositionLogits: main's logits for the last position
              passes/layout.py               LayoutPass: NCHW convs to blocked NCHW{b}c, channels padded
                                             (layouts="measure"/"replay": each op's, passes/layout_choice.py)
              passes/attention.py            PadAttentionKeys: a dynamic key length padded to whole vectors
              passes/kv_cache.py             CacheInPlace: a decoder's cache written and read in place
              passes/dense.py                PackDenseWeights: constant matmul weights in column panels
              passes/tied.py                 TiedEmbeddings: a tied embedding read from those panels
    dispatch  passes/dispatch.py             Dispatch: each 3x3 conv direct or Winograd, as measured
    legalize  passes/legalize.py             LegalizeOps (blocked convs: ours), TVM's AnnotateTIROpPattern,
                                             FoldConstant
    fuse      TVM                            FuseOps, FuseTIR, RewriteDataflowReshape, DeadCodeElimination
    tune      schedules/replay.py            ApplyTuningRecords: records applied (replay, strict), or
                                             MetaSchedule tunes the kernels without one first (tune)
    schedule  schedules/default.py           DefaultSchedules: default rules for every kernel without a record
              passes/tir/positive_dims.py    PositiveDims: kernels told a dynamic dim is at least 1
    lower     passes/weights.py              LiftWeights: a decoder's weights as its programs' argument
              TVM_PIPELINES                  TVM's dataflow lowering of the target
              passes/memory.py               ArenaPlan: arena storage planning on the final shapes
              TVM_PIPELINES                  TVM's finalizing passes of the target (VM lowering)
              passes/shape_reuse.py          ReuseShapes: a dynamic model's shapes built once per call
              passes/tir/poison.py           PoisonScratch: with validate_memory, kernels marked to fill their buffers
    build     compiler/build/codegen/parallel.py   code generation, CPU kernels on every core (exp, tanh, erf,
                                             pow as vector polynomials: passes/tir/fast_math.py), each
              passes/tir/tir_pipeline.py     through TVM's TIR lowering, then DropVerifiedArgChecks,
                                             StackBuffers, BindExpandedArguments, Avx512Sigmoid,
                                             PrefetchNextPanel, NaNThroughBounds, FillScratch

Each phase is timed and the module after it is kept (``compiler/build/instrument.py``), so
``Artifact.ir(phase)`` shows what it did and ``report()["phases"]`` how long it took; the report
adds ``startup`` (options resolved, the compile side imported on a process's first compile),
``retry`` (relaxc's failed attempt before the whole model went to an external backend),
``report`` and ``load`` (the executable loaded to run). Passes that report write their own part of
``Artifact.report()`` (``support/reporting.py``). docs/pipeline.md lists every pass; docs/design.md
says why the phases come in this order.
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

from relaxc.build import backend_choice, report
from relaxc.runtime import diagnostics, external
from relaxc import frontend
from relaxc.frontend import decoder
from relaxc.build.artifact import Artifact
from relaxc.build.codegen import parallel
from relaxc.build.instrument import PhaseRecorder
from relaxc.build.options import Config, Options
from relaxc.passes.tir import fast_math
from relaxc.passes.attention import PadAttentionKeys
from relaxc.passes.kv_cache import CacheInPlace
from relaxc.passes.weights import LiftWeights
from relaxc.passes.decode import DecodeStep, LastPositionLogits
from relaxc.passes.dense import PackDenseWeights
from relaxc.passes.tied import TiedEmbeddings
from relaxc.passes.dispatch import Dispatch
from relaxc.schedules.dispatch import Chooser, MeasuredLayoutCosts
from relaxc.passes.channels_last import ChannelsLastToNCHW
from relaxc.passes.canonicalize.channels import ChannelShuffleToTake, SplitAlongChannelsToSlices
from relaxc.passes.canonicalize.convolutions import Conv1dAsConv2d, DepthwisePointwiseToMultiply
from relaxc.passes.canonicalize.elementwise import (ClipFromTIR, DivideByConstantToMultiply, DropoutToIdentity,
                                                    SumOfStackToAdd)
from relaxc.passes.canonicalize.empty import EmptyConcatOperands
from relaxc.passes.canonicalize.matmuls import MatmulOfFlattenedRows
from relaxc.passes.canonicalize.reductions import GroupNormAsRows, WholeReductionsInSlabs
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
from relaxc.passes.tir.poison import PoisonScratch
from relaxc.passes.tir.positive_dims import PositiveDims
from relaxc.passes.shape_reuse import ReuseShapes
from relaxc.schedules.default import DefaultSchedules
from relaxc.schedules.replay import ApplyTuningRecords
from relaxc.support import remote, tvm_log
from relaxc.support.reporting import summaries
from relaxc.support.errors import UserError
from relaxc.support.targets import TargetLike, byte_dot, dynamic_multiple, vector_lanes, vector_registers
from relaxc.support.threads import configure_threads, pool_threads

log = logging.getLogger("relaxc")


@dataclass(frozen=True)
class Source:
    """The model as the user gave it, with what binds its shapes and inputs."""

    model: frontend.ModelLike
    shapes: frontend.Shapes | None = None
    constants: frontend.Constants | None = None
    dim_bounds: frontend.DimBounds | None = None
    decoder: dict | None = None  # a decoder to generate with: max_length, max_batch, kv_inputs, kv_outputs


@dataclass
class Compilation:
    """What the phases of one compile share: the resolved options, the model as each phase leaves
    it (prepared, partitioned, imported, relaxc's module, the executable), how the partition was
    chosen, the parts of the report the reporting passes have written so far, and the external
    subgraphs' sessions, held until the artifact's runner holds them."""

    config: Config
    source: Source | None = None  # none: a compile from a prepared model (a backend candidate)
    prepared: frontend.Prepared | None = None
    partitioning: frontend.Partitioning = field(default_factory=frontend.Partitioning)
    choice: dict = field(default_factory=dict)  # report()["backends"]: how the partition was chosen
    model: frontend.ImportedModel | None = None
    mod: tvm.IRModule | None = None
    executable: relax.VMExecutable | None = None
    report: dict = field(default_factory=dict)
    sessions: list[external.Session] = field(default_factory=list)
    lifted: LiftWeights | None = None  # a decoder's weights, lifted out of its programs


@dataclass(frozen=True)
class Phase:
    """A phase of passes over relaxc's module, built when it starts."""

    name: str
    passes: Callable[[Compilation], list[tvm.transform.Pass]]

    def run(self, c: Compilation) -> tvm.IRModule:
        with c.config.target, remote.measuring_on(c.config.tracker):
            passes = self.passes(c)
            # a clone: some passes (TVM's dlight among them) assign into the module they are given,
            # which would rewrite the snapshot of the previous phase
            c.mod = tvm.transform.Sequential(passes, name=self.name)(c.mod.clone())
        c.report.update(summaries(passes))
        return c.mod


@dataclass(frozen=True)
class Step:
    """A phase that is no sequence of passes over relaxc's module: what comes before there is one
    (the ONNX model prepared, its partition chosen, its import), and the code generation after."""

    name: str
    run: Callable[[Compilation], object]


def _prepare(c: Compilation) -> None:
    configure_threads()  # constant folding runs kernels: TVM's thread pool may start from here on
    fast_math.register()
    source = c.source
    model, bounds, empty, sums = source.model, source.dim_bounds, (), {}
    if source.decoder is not None:  # its past may be empty: a prompt's first step
        model = frontend.load_model(model)[0]
        found = decoder.recognise(model, **source.decoder)
        if not found.padding and (fed := decoder.with_position_ids(model)) is not None:
            model, found = fed, dataclasses.replace(found, positions=True)  # positions from the mask, as transformers
        dims = found.dims
        bounds, empty = found.bounds_with(bounds), (dims["past"],)
        sums = {dims["total"]: (dims["past"], dims["sequence"])}  # the mask covers the past and the step
        c.report["decoder"] = found.describe()
    c.prepared = frontend.prepare_model(model, source.shapes, source.constants, c.config.backends == "off", bounds,
                                        empty, sums)


def _choose_backends(c: Compilation) -> None:
    source = c.source
    c.partitioning, c.choice = backend_choice.partitioning(
        c.prepared, c.config,
        lambda prepared, given: _artifact(Compilation(c.config, prepared=prepared, partitioning=given), PhaseRecorder()),
        lambda: frontend.bind_constants(frontend.load_model(source.model)[0], source.constants).SerializeToString())


def _import(c: Compilation) -> tvm.IRModule:
    """relaxc's part of the model in Relax, its external subgraphs' sessions opened."""
    c.model = frontend.convert(c.prepared, c.partitioning)
    if "decoder" in c.report and c.model.subgraphs:  # its cache lives in relaxc's program
        elsewhere = "; ".join(f"{sub.backend} would run {', '.join(sorted(sub.ops))} ({sub.why})"
                              for sub in c.model.subgraphs)
        raise UserError(f"a decoder compiled with max_length runs on relaxc alone (compile it with "
                        f"backends='relaxc'): {elsewhere}")
    c.sessions = [external.open_subgraph(sub, pool_threads()) for sub in c.model.subgraphs]
    c.report["backends"] = backend_choice.describe(c.model, c.partitioning, c.config) | c.choice
    c.mod = c.model.module
    return c.mod


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
        EmptyConcatOperands(),
        ChannelsLastToNCHW(),
        CheckIndices(c.config.target.kind.name == "llvm", c.model.index_readers, c.model.onnx_names),
        EliminateCommonSubexpr(),  # TVM's, without hashing every weight's bytes
        relax.transform.CanonicalizeBindings(),
        relax.transform.DeadCodeElimination(),
    ]


def _layout(c: Compilation) -> list[tvm.transform.Pass]:
    target = c.config.target
    packing = ([PackDenseWeights(vector_lanes(target), vector_registers(target),
                                 byte_dot(target)), TiedEmbeddings()]
               if target.kind.name == "llvm" else [])  # GPUs: dlight's matmul rules
    planner = ((lambda mod: _plan_layouts(mod, c)) if target.kind.name == "llvm" and c.config.layout_block >= 4
               and c.config.layouts != "rule" else None)
    attention = [PadAttentionKeys(dynamic_multiple(target))] if target.kind.name == "llvm" else []
    found = _decoder(c)
    decode = ([DecodeStep(found["dims"]["sequence"]), *([] if found["all_logits"] else [LastPositionLogits()])]
              if found is not None else [])
    return [*decode, LayoutPass(c.config.layout_block, c.config.layout_why, c.model.onnx_names, planner),
            *attention, *_cache(c), *packing]


def _decoder(c: Compilation) -> dict | None:
    """``report()["decoder"]`` of a decoder compiled with ``max_length`` (relaxc runs all of it),
    which its generation passes rewrite (cache, decode step, weights); else None."""
    return c.report.get("decoder")


def _cache(c: Compilation) -> list[tvm.transform.Pass]:
    """A decoder's cache in place (``passes/kv_cache.py``)."""
    found = _decoder(c)
    if found is None:
        return []
    pasts = {past for past, _ in found["pairs"]}
    multiple = dynamic_multiple(c.config.target) if c.config.target.kind.name == "llvm" else 16
    rows = -(-found["max_length"] // multiple) * multiple
    indices = [i for i, (name, _, _) in enumerate(c.model.inputs) if name in pasts]
    # what the attention padding replaced, dead, still reads the pasts: gone first
    names = {i: c.model.inputs[i][0] for i in indices}
    return [relax.transform.DeadCodeElimination(), CacheInPlace(names, rows, found),
            relax.transform.DeadCodeElimination()]


def _plan_layouts(mod: tvm.IRModule, c: Compilation) -> tuple[dict, dict]:
    """The graph-level layout choice from the times measured for this CPU (``passes/layout_choice.py``):
    the target's block, the other of 8 and 16 lanes (half a block on AVX-512, two vectors on AVX2),
    and NCHW; the layout pass's own choice where a time is missing."""
    config = c.config
    block = config.layout_block
    layouts = [blocked(block), blocked(block * 2 if block < 16 else block // 2), STANDARD]
    store = config.decisions("layouts")
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
    store = config.decisions("dispatch") if reads_store else None
    unit = (vector_lanes(target), vector_registers(target))
    chooser = Chooser(config.dispatch, config.strategy, store, lambda mod: _build_candidate(mod, c), *unit)
    return [Dispatch(chooser, *unit, measurable=reads_store)]


def _build_candidate(mod: tvm.IRModule, c: Compilation) -> relax.VMExecutable:
    """A dispatch candidate's module through the phases after dispatch, as the model's kernels go:
    tuning records replayed (never tuned, never required), default schedules for the rest."""
    tuning = "off" if c.config.tuning == "off" else "replay"
    alone = Compilation(dataclasses.replace(c.config, tuning=tuning), model=c.model, mod=mod)
    for phase in _phases("legalize"):
        phase.run(alone)
    return alone.executable


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
    if _decoder(c) is not None:
        c.lifted = LiftWeights()  # the weights the kernels read, once every pass before has made them
    lifted = [c.lifted] if c.lifted is not None else []
    poison = [PoisonScratch] if c.config.validate_memory else []  # kernels' own buffers too (passes/tir/poison.py)
    return (lifted + tvm_pipeline.dataflow_lower_passes(target) + [arena] + tvm_pipeline.finalize_passes(target)
            + [ReuseShapes()] + poison)


def _build(c: Compilation) -> relax.VMExecutable:
    c.executable = parallel.build(c.mod, c.config.target)
    return c.executable


PHASES: tuple[Phase | Step, ...] = (
    Step("prepare", _prepare),
    Step("backends", _choose_backends),
    Step("import", _import),
    Phase("simplify", _simplify),
    Phase("layout", _layout),
    Phase("dispatch", _dispatch),
    Phase("legalize", _legalize),
    Phase("fuse", _fuse),
    Phase("tune", _tune),
    Phase("schedule", _schedule),
    Phase("lower", _lower),
    Step("build", _build),
)


def _phases(first: str, stop: str | None = None) -> tuple[Phase | Step, ...]:
    """The phases from ``first`` on, up to ``stop`` (not included)."""
    names = [phase.name for phase in PHASES]
    return PHASES[names.index(first):names.index(stop) if stop else None]


PHASE_NAMES = tuple(phase.name for phase in _phases("import", "build")) + ("final",)  # Artifact.ir(phase)


def compile_model(model: frontend.ModelLike, target: TargetLike = "cpu", shapes: frontend.Shapes | None = None,
                  options: Options = Options(), constants: frontend.Constants | None = None,
                  dim_bounds: frontend.DimBounds | None = None, started: float | None = None,
                  decoder_options: dict | None = None) -> Artifact:
    """Compile ``model`` for ``target``; see ``relaxc.compile`` for the contract. ``started``: when the
    compile began (``time.perf_counter()``), if before this call (default: now); ``decoder_options``:
    a decoder to generate with (``decoder.recognise``'s keywords)."""
    recorder = PhaseRecorder(started)
    c = Compilation(options.resolve(target), Source(model, shapes, constants, dim_bounds, decoder_options))
    recorder.until_now("startup")  # the compile side imported (a process's first compile), options resolved
    with tvm_log.captured() as said:
        _run(c, recorder, _phases("prepare", "backends"))
    # outside the capture: the backend choice's candidates are compiles that capture their own log
    _run(c, recorder, _phases("backends", "import"))
    return _artifact(c, recorder, diagnostics.translate(said))


def _run(c: Compilation, recorder: PhaseRecorder, phases: tuple[Phase | Step, ...]) -> None:
    for phase in phases:
        recorder.run(phase.name, phase.run, c)


def _artifact(c: Compilation, recorder: PhaseRecorder,
              before: tuple[list[str], list[dict]] = ([], [])) -> Artifact:
    """The prepared model, partitioned as ``c`` says, through the phases from import on; the whole
    model on an external backend where TVM's importer fails on relaxc's part and one is installed
    (the failed attempt's seconds: the report's ``retry``). ``before``: the warnings and TVM log of
    the phases before."""
    with tvm_log.captured() as said:
        try:
            _run(c, recorder, _phases("import"))
        except UserError as err:  # what TVM's importer cannot convert goes to an external backend
            whole = None if "decoder" in c.report else backend_choice.whole_model(c.prepared, c.partitioning, err)
            if whole is None:
                raise
            recorder.retried("import", "retry")
            c = Compilation(c.config, c.source, c.prepared, whole, c.choice)
            _run(c, recorder, _phases("import"))
            c.report["backends"]["whole_model_because"] = f"{type(err).__name__}: {err}"
    warned, logged = diagnostics.translate(said)
    c.report["warnings"] = before[0] + warned
    c.report["tvm_log"] = before[1] + logged
    recorder.snapshots["final"] = c.mod
    summary = recorder.run("report", report.assemble, c, recorder.snapshots)
    model = c.model
    artifact = recorder.run("load", Artifact, c.executable, c.config.target, model.inputs, model.outputs, summary,
                            recorder.snapshots, model.subgraphs, model.program_outputs,
                            c.lifted.weights if c.lifted is not None else None)
    summary |= {"phases": recorder.timings, "compile_seconds": recorder.seconds}  # the artifact's report
    return artifact
