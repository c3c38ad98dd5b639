"""Per-kernel profile of one inference: where the time goes, sorted, with each kernel's schedule.

How it measures: one run of ``main`` on a VM whose instrument hook records every kernel call with a
copy of its arguments (the arena is reused, so the bytes a kernel saw must be copied before the
next kernel overwrites them); then each call is replayed alone on its copies, in blocks of runs long
enough to time, and the median block counts. Timing each kernel alone keeps the hook's own cost out
of the numbers (a hook that timed the calls in place added its Python overhead to every kernel);
kernels run with the caches warm from their previous block, as most of them are in the model.
``end_to_end_ms`` is measured without the hook, so the gap between it and the kernels' sum is what
the VM itself costs (allocation, builtins, calls).

External subgraphs (``docs/backends.md``) are rows too, of kind ``external`` with their backend as
schedule: a call from relaxc's program replayed alone on its copies as a kernel is, the tail run
alone on what the program returned; end to end then includes the tail. They have no roofline bound.

Given the machine's limits (``roofline.py``), each kernel also gets its FLOPs and compulsory bytes
(from its TIR before scheduling), the rates it reached, and its roofline fraction: the least time
those FLOPs and bytes can take here over the time it took. ``table(worst=True)`` sorts by the time
lost against that bound, the list that finds a kernel fallen to a schedule far from the hardware.
"""

from __future__ import annotations

import collections
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
import tvm
from tvm import relax, s_tir, tirx

from relaxc.runtime import external
from relaxc.build.artifact import Artifact
from relaxc.build.roofline import Cost, Machine, kernel_cost
from relaxc.schedules.cpu.rows import product_operands
from relaxc.schedules.default import schedule_kind
from relaxc.support.targets import byte_dot
from relaxc.support.threads import pool_threads

SLOW_SHARE, SLOW_FRACTION = 0.05, 0.10  # a kernel over this share of the time, under this fraction of its bound, is a cliff
MIN_BLOCK_SECONDS = 2e-4  # a timed block lasts at least this long: timer and call overhead stay small
BLOCKS = 5
Call = tuple[str, Any, list[Any]]  # a VM call: the callee's symbol, the callee, its arguments


@dataclass
class KernelTime:
    name: str
    schedule: str  # the rule that scheduled it ("tiled", "basic", ...), "tuned", "none", or an external backend
    kind: str  # what it computes: "matmul/conv", "reduction", "elementwise", "data movement" or "external"
    calls: int
    ms: float  # total of its calls in one inference
    share: float  # of the kernels' total
    flops: float = 0.0  # of all its calls, as TVM estimates them from the TIR before scheduling
    nbytes: int = 0  # its arguments, read or written once, in all its calls
    bound_ms: float = 0.0  # the least time those FLOPs and bytes take on this machine (0: no machine given)

    @property
    def roofline(self) -> float:
        """The fraction of the machine's limit this kernel reaches: bound over measured time."""
        return self.bound_ms / self.ms if self.ms else 0.0

    @property
    def lost_ms(self) -> float:
        """Time over the bound; none for an external subgraph, which has no bound."""
        return 0.0 if self.kind == "external" else self.ms - self.bound_ms

    def is_cliff(self) -> bool:
        return self.bound_ms > 0 and self.share > SLOW_SHARE and self.roofline < SLOW_FRACTION


@dataclass
class Profile:
    kernels: list[KernelTime]
    kernels_ms: float
    end_to_end_ms: float
    machine: Machine | None = None

    def as_dict(self) -> dict:
        kernels = [{**asdict(k), "roofline": k.roofline, "lost_ms": k.lost_ms} if self.machine else asdict(k)
                   for k in self.kernels]
        return {"kernels_ms": self.kernels_ms, "end_to_end_ms": self.end_to_end_ms,
                "machine": asdict(self.machine) if self.machine else None, "kernels": kernels}

    def cliffs(self) -> list[KernelTime]:
        """Kernels over ``SLOW_SHARE`` of the time below ``SLOW_FRACTION`` of their bound."""
        return [k for k in self.kernels if k.is_cliff()]

    def table(self, top: int | None = None, worst: bool = False) -> str:
        """The kernels by time (``worst``: by time lost against their bound), ``top`` of them."""
        kernels = sorted(self.kernels, key=lambda k: -k.lost_ms) if worst else self.kernels
        roof = f"  {'GFLOP/s':>7}  {'GB/s':>6}  {'roof':>5}  {'lost':>7}" if self.machine else ""
        lines = [f"{'#':>3}  {'ms':>8}  {'share':>6}  {'cum.':>6}  {'calls':>5}{roof}  {'schedule':<9} {'kind':<13} kernel"]
        cumulative = 0.0
        for rank, k in enumerate(kernels[:top] if top else kernels, 1):
            cumulative += k.share
            rates = " " * len(roof) if not self.machine or k.kind == "external" else \
                f"  {k.flops / k.ms / 1e6:7.1f}  {k.nbytes / k.ms / 1e6:6.1f}  {k.roofline:5.1%}  {k.lost_ms:7.3f}"
            lines.append(f"{rank:>3}  {k.ms:8.3f}  {k.share:6.1%}  {cumulative:6.1%}  {k.calls:>5}{rates}  "
                         f"{k.schedule:<9} {k.kind:<13} {k.name}{'  <- cliff' if k.is_cliff() else ''}")
        if top and len(kernels) > top:
            lines.append(f"     ... {len(kernels) - top} more kernels")
        outside = sum(k.ms for k in self.kernels if k.kind == "external")
        lines.append(f"kernels {self.kernels_ms:.3f} ms" + (f" ({outside:.3f} of them external subgraphs)" if outside else "")
                     + f", end to end {self.end_to_end_ms:.3f} ms (the rest: VM calls, allocation, builtins)")
        if self.machine:
            bound, own = sum(k.bound_ms for k in self.kernels), self.kernels_ms - outside
            lines.append(f"roofline: relaxc's kernels' bound is {bound:.3f} ms ({bound / own if own else 0.0:.1%} of their time); "
                         f"{len(self.cliffs())} cliffs (over {SLOW_SHARE:.0%} of the time, under "
                         f"{SLOW_FRACTION:.0%} of their bound)")
            lines.append(f"machine: {self.machine.summary()}")
        return "\n".join(lines)


def kernel_kind(func: tirx.PrimFunc) -> str:
    """What a kernel computes, from its blocks: a reduction that sums products of two tensors is a
    matmul or convolution, other reductions are reductions, blocks that only copy (each store's
    value a load) are data movement, and the rest is elementwise."""
    sch = s_tir.Schedule(func)
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    reductions = [b for b in blocks if any(v.iter_type == tirx.IterVar.CommReduce for v in b.iter_vars)]
    if any(product_operands(b) is not None for b in reductions):
        return "matmul/conv"
    if reductions:
        return "reduction"
    if blocks and all(isinstance(b.body, tirx.BufferStore) and isinstance(b.body.value, tvm.ir.TensorLoad)
                      for b in blocks):
        return "data movement"
    return "elementwise"


def sums_bytes(func: tirx.PrimFunc) -> bool:
    """Whether the kernel sums products of bytes."""
    sch = s_tir.Schedule(func)
    for block in (sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))):
        operands = product_operands(block)
        if operands is not None and all(str(op.source.dtype) in ("uint8", "int8") for op in operands):
            return True
    return False


def _copy(arg: Any, device: tvm.runtime.Device) -> Any:
    if isinstance(arg, tvm.runtime.Tensor):
        return tvm.runtime.tensor(arg.numpy(), device)
    return arg


def time_call(call: Callable[[], Any], block_seconds: float = MIN_BLOCK_SECONDS) -> float:
    """Median seconds of one call, over ``BLOCKS`` blocks of enough calls to last ``block_seconds``."""
    call()
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(block_seconds / once))
    blocks = []
    for _ in range(BLOCKS):
        start = time.perf_counter()
        for _ in range(number):
            call()
        blocks.append((time.perf_counter() - start) / number)
    return statistics.median(blocks)


def model_calls(program: Any, inputs: dict[str, np.ndarray]) -> tuple[relax.VirtualMachine, list[Call]]:
    """Every call one inference of ``program`` (an ``Artifact`` or a ``Deployed``) makes, kernels
    and builtins, in order, with the arguments it made it with (the VM's own tensors, views of its
    arena: calling them again in order replays the model as it runs); and the VM, which must
    outlive the calls (the arena belongs to it)."""
    calls: list[Call] = []

    def instrument(func, symbol, before_run, _ret, *args):
        if before_run:
            calls.append((symbol, func, list(args)))
        return 0  # VMInstrumentReturnKind.NO_OP

    vm = relax.VirtualMachine(program.executable, tvm.cpu())
    vm.set_instrument(instrument)
    vm["main"](*[tvm.runtime.tensor(inputs[name], tvm.cpu()) for name, _, _ in program.inputs])
    return vm, calls


def _prim_funcs(mod: tvm.IRModule) -> dict[str, tirx.PrimFunc]:
    """The kernels, not the VM's shape functions (a dynamic model's sizes, computed on the host)."""
    return {gv.name_hint: f for gv, f in mod.functions.items()
            if isinstance(f, tirx.PrimFunc) and not (f.attrs or {}).get("tirx.is_host_func")}


def decode_step(art: Artifact, cached: int, machine: Machine | None = None, seed: int = 0) -> Profile:
    """``profile`` of one decode step (its ``decode`` program) of a decoder compiled with
    ``max_length``, after a prompt of ``cached`` random tokens (batch 1)."""
    session = art.session()
    prompt = np.random.default_rng(seed).integers(0, art.decoder["vocab"], (1, cached))
    token = int(np.argmax(session.append(prompt)[0]))
    return profile(art, {}, machine, arguments=session.step_arguments([token]), function="decode")


def profile(art: Artifact, inputs: dict[str, np.ndarray], machine: Machine | None = None,
            arguments: list | None = None, function: str = "main") -> Profile:
    """Profile one inference of ``art`` on ``inputs`` (see the module docstring for how), or a call
    of its ``function`` on its own ``arguments`` (a decoder's step: ``Session.step_arguments``);
    with ``machine``, each kernel's distance from its roofline bound too."""
    served = art.serving(inputs) if arguments is None else None
    if served is not None:  # at this size a library runs the whole model: one external row
        session = external.open_subgraph(served, pool_threads())  # the artifact's own: one per process
        ms = time_call(lambda: session.run([inputs[name] for name in served.inputs])) * 1e3
        return Profile([KernelTime(served.function, served.backend, "external", 1, ms, 1.0)], ms,
                       time_call(lambda: art.run(inputs)) * 1e3, machine)
    kernels = _prim_funcs(art.module("final"))
    unscheduled = {**kernels, **_prim_funcs(art.module("fuse"))}
    backends = {sub.function: sub.backend for sub in art.subgraphs}
    dot = byte_dot(art.target)
    device = tvm.cpu()
    calls: list[Call] = []

    def instrument(func, symbol, before_run, _ret, *args):
        if before_run and (symbol in kernels or symbol in backends):
            calls.append((symbol, func, [_copy(a, device) for a in args]))
        return 0  # VMInstrumentReturnKind.NO_OP

    vm = relax.VirtualMachine(art.executable, device)
    vm.set_instrument(instrument)
    args = [tvm.runtime.tensor(a, device) if isinstance(a, np.ndarray) else a for a in arguments] \
        if arguments is not None else [tvm.runtime.tensor(inputs[name], device) for name, _, _ in art.inputs]
    vm[function](*args)
    seconds: dict[str, float] = collections.defaultdict(float)
    counts: collections.Counter = collections.Counter()
    shapes: dict[str, list[tuple[int, ...]]] = {}  # each kernel's argument shapes (its first call's)
    for symbol, func, copies in calls:
        seconds[symbol] += time_call(lambda: func(*copies))
        counts[symbol] += 1
        shapes.setdefault(symbol, [tuple(a.shape) for a in copies if isinstance(a, tvm.runtime.Tensor)])
    tail = next((sub for sub in art.subgraphs if sub.tail and sub.serves is None), None)
    if tail is not None:
        session = external.open_subgraph(tail, pool_threads())  # the artifact's own: one per process
        values = art.program_values(inputs)
        seconds[tail.function] = time_call(lambda: session.run([values[name] for name in tail.inputs]))
        counts[tail.function] = 1
    total = sum(seconds.values())
    rows = []
    for name, s in sorted(seconds.items(), key=lambda item: -item[1]):
        if name in backends:
            rows.append(KernelTime(name, backends[name], "external", counts[name], s * 1e3, s / total if total else 0.0))
            continue
        cost = kernel_cost(unscheduled[name], shapes[name]) if machine else Cost(0.0, 0)
        label = schedule_kind(kernels[name])
        speedup = dot.products_per_multiply if dot is not None and sums_bytes(unscheduled[name]) else 1.0  # products a lane sums
        bound_ms = machine.bound_s(cost.flops, cost.nbytes, speedup) * 1e3 * counts[name] if machine else 0.0
        rows.append(KernelTime(name, label, kernel_kind(unscheduled[name]), counts[name],
                               s * 1e3, s / total if total else 0.0, cost.flops * counts[name],
                               cost.nbytes * counts[name], bound_ms))
    if tail is not None:
        end_to_end = time_call(lambda: art.run(inputs))
    else:
        plain = relax.VirtualMachine(art.executable, device)
        end_to_end = time_call(lambda: plain[function](*args))
    return Profile(rows, total * 1e3, end_to_end * 1e3, machine)
