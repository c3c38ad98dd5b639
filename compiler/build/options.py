"""The options of a compile and of a tuning run, each defined once: here.

Every option is a dataclass field with its default and its help. Its choices come from the layer
that owns them (tuning modes from ``schedules/replay.py``, the modes of the measured decisions
from ``schedules/decisions.py``, memory planners from ``passes/memory.py``). The Python API takes
the fields as keywords, the CLI builds its flags from the same fields (``compiler/cli.py``), and
``Options.resolve`` fills in the target's defaults and checks every value, once, before any work
starts.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

from tvm.target import Target

from relaxc.runtime import external
from relaxc.build.codegen import toolchain
from relaxc.passes.memory import PLANNERS
from relaxc.schedules.cache import store_for
from relaxc.schedules.decisions import MODES, DecisionStore
from relaxc.schedules.dispatch import STRATEGIES
from relaxc.schedules.replay import MODES as TUNING_MODES
from relaxc.schedules.sequence import SELECTIONS
from relaxc.schedules.tuning import DEFAULT_TRIALS
from relaxc.support import remote, targets
from relaxc.support.errors import TargetError, UserError

LAYOUT_MODES = tuple(mode for mode in MODES if mode != "off")  # the rule is the layout pass's own choice
RENAMED = {("dispatch", "heuristic"): "rule", ("backends", "fallback"): "rule"}
RELAXC_ONLY = "relaxc"  # backends="relaxc": the same as "off", named for what then runs the model
BACKENDS_VARIABLE = "RELAXC_BACKENDS"  # the backends mode where a compile names none


def _option(default: Any, help: str, *, type: type | None = None, choices: tuple | None = None,  # noqa: A002
            flag: str | tuple[str, ...] | None = None, metavar: str | None = None) -> Any:
    """A field with what the CLI needs to offer it: help, value type (when the default is None),
    choices, a flag other than ``--<name>`` (or several: the first, then its aliases), a metavar."""
    return dataclasses.field(default=default, metadata={"help": help, "type": type, "choices": choices,
                                                        "flag": flag, "metavar": metavar})


@dataclass(frozen=True)
class Config:
    """The options resolved for one target, every default filled in: what the pipeline reads."""

    target: Target
    layout_block: int  # channel block of NCHW{b}c; 0 keeps NCHW
    layout_why: str  # why this block: report()["layout"]["why"]
    memory_planner: str
    unshared: tuple[str, ...]
    validate_memory: bool
    tuning: str
    dispatch: str
    strategy: str
    layouts: str
    cache_dir: str | None
    tools: dict[str, str]  # versions of the external tools code generation uses (fingerprinted)
    tracker: remote.Tracker | None = None  # where kernels are timed (None: this machine); not fingerprinted
    backends: str = "off"
    backend_overrides: Mapping[str, str] = dataclasses.field(default_factory=dict)
    measure_budget_s: float = 180.0

    def fingerprint_options(self) -> dict:
        """The options that change what the pipeline produces for a given module."""
        return {"layout_block": self.layout_block, "memory_planner": self.memory_planner, "dispatch": self.dispatch,
                "strategy": self.strategy, "layouts": self.layouts,
                "unshared": list(self.unshared), "validate_memory": self.validate_memory}

    def decisions(self, kind: str) -> DecisionStore:
        """The measured decisions of ``kind`` for this target in the cache, strict under
        ``tuning="strict"``."""
        return DecisionStore(store_for(self.cache_dir, self.target), kind, strict=self.tuning == "strict")


@dataclass(frozen=True)
class Options:
    """What a compile may choose besides model, target and shapes; None means the target's default."""

    tuning: str = _option("replay", "apply the tuning records there are (replay), require one for every "
                          "kernel and a stored decision for every one replayed: dispatch, layouts, backends, "
                          "machine (strict), tune what is missing first (tune), or use the default "
                          "schedules only (off)", choices=TUNING_MODES)
    dispatch: str = _option("replay", "choose each 3x3 convolution's implementation (direct, Winograd F(2x2), "
                            "F(4x4)) from the measurements stored for this CPU, by a fixed rule where there are "
                            "none (replay); measure the missing ones first and store them (measure); by the "
                            "rule only (rule); or direct everywhere (off)", choices=MODES,
                            flag="--dispatch-mode")  # `relaxc inspect --dispatch` prints the choices
    strategy: str = _option("latency", "what dispatch and the measured backend choice minimise: time (latency) or "
                            "memory (memory: a convolution's intermediates; a backend's measured footprint)",
                            choices=STRATEGIES)
    layouts: str = _option("rule", "each op's layout: the target's block wherever an op can run in it (rule); or "
                           "the graph-level choice among NCHW and two blocks, converters included, from times "
                           "stored for this CPU (replay; the rule where any is missing) or measured now "
                           "(measure). Experimental: docs/layout_choice.md", choices=LAYOUT_MODES)
    cache_dir: str | None = _option(None, "the cache (tuning records and measured decisions, docs/cache.md), "
                                    "used alone (default: $RELAXC_CACHE_DIR or ~/.cache/relaxc, over the "
                                    "stores relaxc ships)", flag=("--cache-dir", "--log-dir"), metavar="DIR")
    layout_block: int | None = _option(None, "channel block b of the blocked NCHW{b}c layout (default: the "
                                       "target's fp32 vector lanes on CPU, 0 on GPU); 0 keeps NCHW",
                                       type=int, flag="--block", metavar="B")
    memory_planner: str | None = _option(None, "every intermediate at an offset of one arena (arena, the CPU "
                                         "default; report()['memory'] compares both) or TVM's "
                                         "StaticPlanBlockMemory (tvm, the GPU default and only choice "
                                         "there so far)", choices=PLANNERS)
    unshared: tuple[str, ...] = _option((), "kernels (glob patterns of the kernel names in "
                                        "report()['memory']['tensors']) whose outputs get bytes of their "
                                        "own, never reused", metavar="GLOB")
    validate_memory: bool = _option(False, "check the memory plans pair by pair and fill each program's arena, "
                                    "and every buffer a kernel allocates, with garbage before it is used")
    backends: str | None = _option(None, "what runs the model: relaxc's own kernels only (off, or relaxc); those, and "
                                   "an installed external backend (onnxruntime, openvino) for the nodes relaxc cannot "
                                   "compile (rule); the rule plus the partition measured for this CPU before, where "
                                   "there is one (replay); or measure the partitions without a decision first and keep "
                                   "them (measure). Default: $RELAXC_BACKENDS, else replay. docs/backends.md",
                                   type=str, choices=(*MODES, RELAXC_ONLY), flag="--backends")
    backend_overrides: Any = _option((), "pin nodes to a backend: GLOB=BACKEND, the glob matched against node "
                                     "names, BACKEND relaxc, onnxruntime or openvino (a dict in the Python API)",
                                     metavar="GLOB=BACKEND", flag="--backend-override")
    measure_budget_s: float = _option(180.0, "with backends='measure': seconds spent measuring subgraphs at most; "
                                      "what is not measured in time stays on relaxc's kernels and is reported")
    rpc: str | None = _option(None, "time kernels (tuning, dispatch='measure', layouts='measure') on the devices "
                              "of this TVM RPC tracker instead of this machine; target 'cpu' then means their "
                              "CPU (docs/rpc.md)", metavar="HOST:PORT")
    rpc_key: str | None = _option(None, "the key the devices registered under at the tracker (with rpc)",
                                  metavar="KEY")

    def resolve(self, target: targets.TargetLike) -> Config:
        """These options for ``target`` with its defaults filled in; a UserError for any bad value.
        Checks the external tools the target's code generation needs, too, so they fail first."""
        self._check_choices()
        if self.rpc_key and not self.rpc:
            raise UserError("rpc_key names devices at an RPC tracker: give the tracker too (rpc='HOST:PORT')")
        tracker = remote.Tracker.parse(self.rpc, self.rpc_key) if self.rpc else None
        tvm_target = targets.resolve(target) if tracker is None else _remote_target(target, tracker)
        kind = tvm_target.kind.name
        if kind not in targets.KINDS:
            raise TargetError(f"target kind {kind!r} is not supported; relaxc compiles for {', '.join(targets.KINDS)}")
        gpu = targets.is_gpu(tvm_target)
        tools = toolchain.prepare(kind)
        block, why = self.layout_block, "given by the caller"
        if block is None:
            block, why = ((0, "GPU: NCHW until NCHW, NHWC and blocked are measured on one (docs/gpu.md)")
                          if gpu else (targets.vector_lanes(tvm_target), "the target's fp32 vector lanes"))
        if block != 0 and block < 2:
            raise UserError(f"layout_block must be 0 (keep NCHW) or at least 2, not {block}")
        planner = self.memory_planner or ("tvm" if gpu else "arena")
        if gpu and (planner == "arena" or self.unshared or self.validate_memory):
            raise UserError("the arena planner (and unshared, validate_memory) is CPU-only so far: its kernels "
                            "take element offsets, never run on a GPU yet; use memory_planner='tvm'")
        if self.measure_budget_s <= 0:
            raise UserError(f"measure_budget_s must be positive, not {self.measure_budget_s}")
        return Config(tvm_target, block, why, planner, tuple(self.unshared), self.validate_memory, self.tuning,
                      self.dispatch, self.strategy, self.layouts, self.cache_dir, tools, tracker,
                      self.backends_mode(),
                      self.overrides(), float(self.measure_budget_s))

    def backends_mode(self) -> str:
        """``backends``, else ``$RELAXC_BACKENDS`` (a CI or a deployment that must never run another
        runtime sets it to relaxc), else replay; "relaxc" is "off"; a UserError for a bad value."""
        mode = self.backends or os.environ.get(BACKENDS_VARIABLE) or "replay"
        if self.backends is None and mode not in (*MODES, RELAXC_ONLY):
            raise UserError(f"${BACKENDS_VARIABLE} must be one of {', '.join((*MODES, RELAXC_ONLY))}, not {mode!r}")
        return "off" if mode == RELAXC_ONLY else mode

    def overrides(self) -> dict[str, str]:
        """``backend_overrides`` as {glob: backend}, from a dict or GLOB=BACKEND strings, checked."""
        given = self.backend_overrides
        if isinstance(given, Mapping):
            pairs = list(given.items())
        else:
            pairs = [text.rpartition("=")[::2] for text in ([given] if isinstance(given, str) else given)]
        overrides = {}
        for glob, backend in pairs:
            if not glob or backend not in ("relaxc", *external.backends()):
                raise UserError(f"backend_overrides takes GLOB=BACKEND with BACKEND one of relaxc, "
                                f"{', '.join(external.backends())}; got {glob!r}={backend!r}")
            overrides[glob] = backend
        return overrides

    def _check_choices(self) -> None:
        """A UserError naming the option and its choices, for the first value not among them (and
        the mode's name, for a mode spelled as it was before every decision took the same modes)."""
        for field in dataclasses.fields(self):
            choices, value = field.metadata["choices"], getattr(self, field.name)
            if isinstance(value, str) and (field.name, value) in RENAMED:
                raise UserError(f"{field.name}={value!r} is spelled {RENAMED[field.name, value]!r} now: every "
                                f"measured decision takes the modes {', '.join(MODES)} (docs/cache.md)")
            if choices is not None and value is not None and value not in choices:
                raise UserError(f"{field.name} must be one of {', '.join(choices)}, not {value!r}")


def _remote_target(target: targets.TargetLike, tracker: remote.Tracker) -> Target:
    """``target`` for the devices of ``tracker`` (probed): theirs where it is ``"cpu"``; any other must
    name their CPU and cores."""
    device = remote.probe(tracker)
    if target == "cpu":
        return device.target()
    resolved = targets.resolve(target)
    spec = targets.describe(resolved)
    if resolved.kind.name != "llvm" or spec.get("mcpu") != device.cpu or spec.get("num-cores") != device.cores:
        raise TargetError(f"the devices under {tracker} are {device.cpu} with {device.cores} cores, and what they "
                          f"measure belongs in that target's store, not {json.dumps(spec)}'s: use target 'cpu' "
                          "(theirs)")
    return resolved


@dataclass(frozen=True)
class TuneOptions:
    """What a tuning run may choose (``compiler.tune``, ``relaxc tune``)."""

    trials: int = _option(DEFAULT_TRIALS, "total measurements (0: tune nothing, only choose among the "
                          "records there are)")
    trials_per_task: int | None = _option(None, "measurements per kernel (default: an even share, at least 64)",
                                          type=int)
    minutes: float | None = _option(None, "end within this many minutes, the compile and the selection included",
                                   type=float)
    kernels: tuple[str, ...] = _option((), "tune and select only the kernels whose names match (names as in "
                                       "report()['tuning'])", metavar="GLOB")
    reselect: bool = _option(False, "measure every kernel's default and best records side by side again, "
                             "even if its records did not change")
    selection: str = _option("alone", "how each kernel's schedule is chosen among its default and best records: "
                             "timed alone, cold ('alone': the kernels whose records changed, every one with "
                             "--reselect), or in the model's sequence after tuning ('sequence': every kernel, "
                             "schedules/sequence.py, and before it each convolution's implementation, "
                             "schedules/dispatch_sequence.py)", choices=SELECTIONS)
    shard: str | None = _option(None, "tune only share I of N of the kernels (each machine of N its own I, 0 to "
                                "N-1), selecting nothing: merge the stores (relaxc cache merge), then select "
                                "with --trials 0", metavar="I/N")

    def shard_index(self) -> tuple[int, int] | None:
        """``shard`` as (i, n); a UserError where it is not I/N with 0 <= I < N."""
        if self.shard is None:
            return None
        index, sep, count = self.shard.partition("/")
        if not (sep and index.strip().isdigit() and count.strip().isdigit() and int(index) < int(count)):
            raise UserError(f"shard must be I/N with 0 <= I < N (e.g. 0/2), not {self.shard!r}")
        return int(index), int(count)

