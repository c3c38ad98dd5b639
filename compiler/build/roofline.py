"""The machine's limits and how far a kernel runs from them (a roofline).

A kernel cannot run faster than its FLOPs at the machine's peak FMA rate, nor faster than its
compulsory bytes (inputs read once, outputs written once) at the bandwidth of the memory level
they fit in; ``bound_s`` is the larger of the two, and a kernel's roofline fraction is that bound
over its measured time.

Both limits are measured, not computed from a data sheet: a VM hides its clock, and TVM answers
512-bit vectors for every x86 CPU. The peak is a TIR kernel of independent vector FMAs held in
registers, the best of a few vector widths and accumulator counts, on every thread of the pool;
the bandwidth is a vectorised parallel sum over buffers from 16 KiB a thread to 512 MiB, so a
kernel whose bytes fit a cache is held to that cache's bandwidth (``relaxc profile`` replays each
kernel with the caches warm, as most kernels run in the model). Measured once per CPU, core count
and thread count, in about four seconds, and kept in the cache (the ``machine`` decisions,
``machine.json``: ``schedules/decisions.py``).
"""

from __future__ import annotations

import datetime
import math
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.script import tirx as T
from tvm.target import Target

from relaxc.passes.tir import fast_math
from relaxc.passes.ir import at_sizes, call_sizes
from relaxc.schedules.cache import store_for
from relaxc.schedules.cpu.steps import buffer_bytes
from relaxc.schedules.decisions import DecisionStore
from relaxc.support.threads import pool_threads
from relaxc.support.turns import block

FMA_SHAPES = ((8, 8), (8, 12), (16, 6), (16, 8), (16, 12))  # (lanes, accumulators): one fits each vector width
FMA_FLOPS_PER_THREAD = 4e8  # a call lasts a few milliseconds at any FMA rate of today's cores
STREAM_LANES, STREAM_CHAINS = 16, 8  # eight independent sums: the adds' latency never limits a load port
STREAM_BYTES = 4 * STREAM_LANES * STREAM_CHAINS  # one step of the stream kernel
PER_THREAD_LEVELS = (16 << 10, 256 << 10, 2 << 20)  # in L1, in L2, in a share of L3 (bytes a thread)
MEMORY_BYTES = 512 << 20  # past every last-level cache a VM shows
STREAM_SECONDS = 2e-3  # a bandwidth call lasts about this long (its parallel launch then costs little)
RUNS = 5
PEAK_SECONDS = 1.5  # the FMA shapes timed in turn at least this long: a VM's slow phases last seconds
# (a peak taken in 0.15 s read 177 GFLOP/s on a Cascade Lake VM where a matmul then ran at 262)


@dataclass(frozen=True)
class Machine:
    """What one thread pool of this CPU can do: fp32 FMA peak, and bandwidth by working set."""

    threads: int
    peak_gflops: float
    bandwidth: tuple[tuple[int, float], ...]  # (total bytes, GB/s), working sets in increasing size

    def gbps_for(self, nbytes: float) -> float:
        """The bandwidth of the smallest measured working set that holds ``nbytes``."""
        return next((gbps for size, gbps in self.bandwidth if nbytes <= size), self.bandwidth[-1][1])

    def bound_s(self, flops: float, nbytes: float, speedup: float = 1.0) -> float:
        """The least time a kernel of ``flops`` and compulsory ``nbytes`` can take here, its
        arithmetic ``speedup`` times the fp32 FMA rate (for 8-bit products, the products a lane of
        the target's byte dot product sums per multiplying instruction, ``support/targets.py``'s
        ``ByteDot.products_per_multiply``, where an FMA does one)."""
        return max(flops / (self.peak_gflops * speedup * 1e9), nbytes / (self.gbps_for(nbytes) * 1e9))

    def summary(self) -> str:
        levels = ", ".join(f"{_size(size)} {gbps:.0f}" for size, gbps in self.bandwidth)
        return f"{self.threads} threads: fp32 FMA peak {self.peak_gflops:.0f} GFLOP/s; GB/s by working set: {levels}"


@dataclass(frozen=True)
class Cost:
    """What a kernel must do at least: FLOPs of its TIR, bytes of its arguments once each."""

    flops: float
    nbytes: int


def kernel_cost(func: tirx.PrimFunc, shapes: list[tuple[int, ...]] | None = None) -> Cost:
    """FLOPs as TVM estimates them from the loops and their bodies, with each call of a function that
    ``fast_math`` expands (exp, tanh, erf, sigmoid) counted as the arithmetic of its expansion (TVM
    counts it as nothing: a softmax read as 4 FLOPs an element, 42 with its exp); bytes of every
    buffer argument. ``shapes``: the buffer arguments' shapes in a call (a kernel of dynamic
    extents is counted as that call runs it)."""
    buffers = [param for param in func.params if tirx.is_buffer_var(param)]
    if shapes is None:
        nbytes = sum(buffer_bytes(param) for param in buffers)
    else:
        func = at_sizes(func, call_sizes(func, shapes))
        nbytes = sum(math.prod(shape) * param.dtype.bits // 8 for param, shape in zip(buffers, shapes))
    return Cost(float(s_tir.analysis.estimate_tir_flops(_expansions_spelled_out(func.body))), nbytes)


def _expansions_spelled_out(body: tirx.Stmt) -> tirx.Stmt:
    """``body`` with each expanded call replaced, for counting only, by as many multiplications of
    its argument as its expansion has operations, so that TVM's estimator weighs them by the loops
    they sit in."""
    def spell_out(call: tvm.ir.Call) -> tirx.PrimExpr:
        if not fast_math.expanded(call):
            return call
        value = call.args[0]
        for _ in range(fast_math.operations(call.op.name)):
            value = tirx.Mul(value, tirx.const(1, value.ty.dtype))
        return value

    return tvm_ffi.structural_map(body, (tvm.ir.Call, spell_out))


def machine(target: Target, cache_dir: str | None = None, remeasure: bool = False, strict: bool = False) -> Machine:
    """This CPU's limits with the pool's threads: from the cache, else measured and kept there
    (``strict``: else a UserError, as ``tuning="strict"`` has for every measured decision)."""
    threads = pool_threads()
    store = DecisionStore(store_for(cache_dir, target), "machine", strict=strict)
    key = f"threads={threads}"
    entry = None if remeasure else store.load().get(key)
    if entry is None:
        if not remeasure:
            store.missing(key, "run `relaxc profile` once without tuning='strict' on this CPU")
        entry = {**asdict(measure(target, threads)), "measured": datetime.date.today().isoformat()}
        store.save(key, entry)
    return Machine(threads, entry["peak_gflops"], tuple((int(s), float(g)) for s, g in entry["bandwidth"]))


def measure(target: Target, threads: int) -> Machine:
    """Measure the peak FMA rate and the bandwidth by working set (see the module docstring)."""
    kernels = {f"fma_{lanes}x{accs}": _fma_kernel(threads, lanes, accs) for lanes, accs in FMA_SHAPES}
    kernels["stream"] = _stream_kernel(threads)
    lib = tvm.compile(tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in kernels.items()}),
                      target=target)
    peak, start = 0.0, time.perf_counter()
    while time.perf_counter() - start < PEAK_SECONDS:
        for lanes, accs in FMA_SHAPES:
            out = tvm.runtime.empty((threads, lanes * accs), "float32")
            steps = int(FMA_FLOPS_PER_THREAD / (2 * lanes * accs))
            seconds = _best_seconds(lambda: lib[f"fma_{lanes}x{accs}"](out, steps))
            peak = max(peak, 2 * threads * steps * lanes * accs / seconds / 1e9)
    sizes = [size * threads for size in PER_THREAD_LEVELS] + [max(MEMORY_BYTES, 16 * PER_THREAD_LEVELS[-1] * threads)]
    stream, out = lib["stream"], tvm.runtime.empty((threads, STREAM_LANES), "float32")
    bandwidth = []
    for size in sizes:
        steps = size // STREAM_BYTES // threads
        data = tvm.runtime.tensor(np.zeros((threads, steps, STREAM_BYTES // 4), "float32"))
        repeats = max(1, int(STREAM_SECONDS / _best_seconds(lambda: stream(data, out, 1))))
        seconds = _best_seconds(lambda: stream(data, out, repeats)) / repeats
        bandwidth.append((threads * steps * STREAM_BYTES, threads * steps * STREAM_BYTES / seconds / 1e9))
    return Machine(threads, peak, tuple(bandwidth))


def _best_seconds(call: Callable[[], object]) -> float:
    """The fastest of ``RUNS`` calls after one to warm up (``turns.block``): what the machine can
    do, not what it did while something else ran."""
    return min(block(call, RUNS, idle_s=0)) / 1e3


def _fma_kernel(threads: int, lanes: int, accs: int) -> tirx.PrimFunc:
    """``accs`` vectors of ``lanes`` each updated by an FMA ``steps`` times, on every thread."""
    width = lanes * accs

    @T.prim_func
    def fma(out: T.Buffer((threads, width), "float32"), steps: T.int32):
        T.func_attr({"tir.noalias": True})
        for t in T.parallel(threads):
            acc = T.alloc_buffer((width,), "float32", scope="local")
            for v in T.vectorized(width):
                acc[v] = T.float32(1) + T.Cast("float32", v) * T.float32(1e-6)
            for _ in range(steps):
                for k in T.unroll(accs):
                    for v in T.vectorized(lanes):
                        acc[k * lanes + v] = acc[k * lanes + v] * T.float32(0.9999) + T.float32(1e-4)
            for v in T.vectorized(width):
                out[t, v] = acc[v]

    return fma


def _stream_kernel(threads: int) -> tirx.PrimFunc:
    """Each thread sums its own slice of ``data``, ``repeats`` times, into ``STREAM_CHAINS`` vectors."""
    lanes, chains, step = STREAM_LANES, STREAM_CHAINS, STREAM_BYTES // 4

    @T.prim_func
    def stream(a: T.handle, out: T.Buffer((threads, lanes), "float32"), repeats: T.int32):
        T.func_attr({"tir.noalias": True})
        steps = T.int64()
        data = T.match_buffer(a, (threads, steps, step), "float32")
        for t in T.parallel(threads):
            acc = T.alloc_buffer((step,), "float32", scope="local")
            for v in T.vectorized(step):
                acc[v] = T.float32(0)
            for _, i in T.grid(repeats, steps):
                for k in T.unroll(chains):
                    for v in T.vectorized(lanes):
                        acc[k * lanes + v] = acc[k * lanes + v] + data[t, i, k * lanes + v]
            for v in T.vectorized(lanes):
                out[t, v] = acc[v]
            for k, v in T.grid(chains - 1, lanes):
                out[t, v] = out[t, v] + acc[(k + 1) * lanes + v]

    return stream


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"
