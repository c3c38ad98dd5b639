"""Per-kernel profile of one inference: where the time goes, sorted, with each kernel's schedule.

How it measures: one run of ``main`` on a VM whose instrument hook records every kernel call with a
copy of its arguments (the arena is reused, so the bytes a kernel saw must be copied before the
next kernel overwrites them); then each call is replayed alone on its copies, in blocks of runs long
enough to time, and the median block counts. Timing each kernel alone keeps the hook's own cost out
of the numbers (a hook that timed the calls in place added its Python overhead to every kernel);
kernels run with the caches warm from their previous block, as most of them are in the model.
``end_to_end_ms`` is measured without the hook, so the gap between it and the kernels' sum is what
the VM itself costs (allocation, builtins, calls).
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

from relaxc.artifact import Artifact
from relaxc.schedules.cpu.rows import is_product_sum
from relaxc.schedules.default import schedule_kind

MIN_BLOCK_SECONDS = 2e-4  # a timed block lasts at least this long: timer and call overhead stay small
BLOCKS = 5
Call = tuple[str, Any, list[Any]]  # a VM call: the callee's symbol, the callee, its arguments


@dataclass
class KernelTime:
    name: str
    schedule: str  # the rule that scheduled it ("tiled", "basic", ...), "tuned", or "none"
    kind: str  # what it computes: "matmul/conv", "reduction", "elementwise" or "data movement"
    calls: int
    ms: float  # total of its calls in one inference
    share: float  # of the kernels' total


@dataclass
class Profile:
    kernels: list[KernelTime]
    kernels_ms: float
    end_to_end_ms: float

    def as_dict(self) -> dict:
        return {"kernels_ms": self.kernels_ms, "end_to_end_ms": self.end_to_end_ms,
                "kernels": [asdict(k) for k in self.kernels]}

    def table(self, top: int | None = None) -> str:
        lines = [f"{'#':>3}  {'ms':>8}  {'share':>6}  {'cum.':>6}  {'calls':>5}  {'schedule':<9} {'kind':<13} kernel"]
        cumulative = 0.0
        for rank, k in enumerate(self.kernels[:top] if top else self.kernels, 1):
            cumulative += k.share
            lines.append(f"{rank:>3}  {k.ms:8.3f}  {k.share:6.1%}  {cumulative:6.1%}  {k.calls:>5}  "
                         f"{k.schedule:<9} {k.kind:<13} {k.name}")
        if top and len(self.kernels) > top:
            lines.append(f"     ... {len(self.kernels) - top} more kernels")
        lines.append(f"kernels {self.kernels_ms:.3f} ms, end to end {self.end_to_end_ms:.3f} ms "
                     f"(the rest: VM calls, allocation, builtins)")
        return "\n".join(lines)


def kernel_kind(func: tirx.PrimFunc) -> str:
    """What a kernel computes, from its blocks: a reduction that sums products of two tensors is a
    matmul or convolution, other reductions are reductions, blocks that only copy (each store's
    value a load) are data movement, and the rest is elementwise."""
    sch = s_tir.Schedule(func)
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    reductions = [b for b in blocks if any(v.iter_type == tirx.IterVar.CommReduce for v in b.iter_vars)]
    if any(is_product_sum(b) for b in reductions):
        return "matmul/conv"
    if reductions:
        return "reduction"
    if blocks and all(isinstance(b.body, tirx.BufferStore) and isinstance(b.body.value, tvm.ir.TensorLoad)
                      for b in blocks):
        return "data movement"
    return "elementwise"


def _copy(arg: Any, device: tvm.runtime.Device) -> Any:
    if isinstance(arg, tvm.runtime.Tensor):
        return tvm.runtime.tensor(arg.numpy(), device)
    return arg


def _time_call(call: Callable[[], Any]) -> float:
    """Median seconds of one call, over ``BLOCKS`` blocks of enough calls to last a while."""
    call()
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(MIN_BLOCK_SECONDS / once))
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


def profile(art: Artifact, inputs: dict[str, np.ndarray]) -> Profile:
    """Profile one inference of ``art`` on ``inputs`` (see the module docstring for how)."""
    final = art.module("final")
    kernels = {gv.name_hint: f for gv, f in final.functions.items() if isinstance(f, tirx.PrimFunc)}
    device = tvm.cpu()
    calls: list[Call] = []

    def instrument(func, symbol, before_run, _ret, *args):
        if before_run and symbol in kernels:
            calls.append((symbol, func, [_copy(a, device) for a in args]))
        return 0  # VMInstrumentReturnKind.NO_OP

    vm = relax.VirtualMachine(art.executable, device)
    vm.set_instrument(instrument)
    args = [tvm.runtime.tensor(inputs[name], device) for name, _, _ in art.inputs]
    vm["main"](*args)
    seconds: dict[str, float] = collections.defaultdict(float)
    counts: collections.Counter = collections.Counter()
    for symbol, func, copies in calls:
        seconds[symbol] += _time_call(lambda: func(*copies))
        counts[symbol] += 1
    total = sum(seconds.values())
    rows = [KernelTime(name, schedule_kind(kernels[name]), kernel_kind(kernels[name]), counts[name],
                       s * 1e3, s / total if total else 0.0)
            for name, s in sorted(seconds.items(), key=lambda item: -item[1])]
    plain = relax.VirtualMachine(art.executable, device)
    end_to_end = _time_call(lambda: plain["main"](*args))
    return Profile(rows, total * 1e3, end_to_end * 1e3)
