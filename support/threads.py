"""TVM's thread pool: one thread per physical core, not pinned to cores, unless the user chose.

TVM reads ``TVM_NUM_THREADS`` and ``TVM_BIND_THREADS`` when its thread pool starts: at the first
parallel kernel a process runs (a constant folded at compile time, a model's first run, a kernel
timed in tuning) and in each of MetaSchedule's worker processes, which inherit the environment.
``configure_threads`` sets relaxc's defaults just before those: when a compile starts, when an
artifact is loaded and when tuning starts. Importing relaxc changes nothing.

Why these defaults:
- TVM's own thread count is half the logical CPUs (to skip hyper-threads): one thread on a 2-core VM
  without SMT, which ran ResNet-50 in 171 ms instead of 96.
- TVM pins each thread to a core. On a 2-vCPU VM that made tuned ResNet-50 slower and erratic
  (median 55-64 ms, runs from 49 to 72 ms) against 48-50 ms unpinned.
- TVM's idle workers yield the core 300,000 times before they sleep (``TVM_THREAD_POOL_SPIN_COUNT``,
  read once a process): about 150 ms of spinning after a model's last kernel, on the cores an
  onnxruntime session then needs. onnxruntime running MobileNetV4 0.1 s after relaxc's kernels
  took 15.1 ms instead of 3.9 (Zen 3, 2 cores). relaxc sets the count of yields that takes
  ``SPIN_S`` on this machine (``spin_count``): it bridges the gaps between one inference's
  kernels and stops within a few milliseconds. A count is no time: a yield costs 500 ns on the Zen 3
  VM (2,000 yields, 1 ms: MobileNetV2, BERT, SqueezeNet, EfficientNet-B0 and ResNet-18 as fast
  as with TVM's default, where no spinning at all cost MobileNetV2 up to 1.3x) and 170 ns on a
  Sapphire Rapids class one, where 2,000 yields (0.34 ms) put workers to sleep between kernels:
  MobileNetV3-Large 5.0 ms against 3.0 with 6,000 (1 ms) and 2.9 with 20,000.
"""

from __future__ import annotations

import os
import time
from typing import Callable


def physical_cores() -> int:
    """Physical cores (hyper-threads share a core's vector units, so kernels do not gain from them)."""
    import psutil

    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


SPIN_S = 1.5e-3  # how long an idle TVM worker yields before it sleeps, timed in Python (TVM yields faster)
_SPIN_RANGE = (1000, 300_000)  # TVM's default is the most
_spin_count: int | None = None


def spin_count() -> int:
    """The yields that take about ``SPIN_S`` here, timed once a process (``yield_s``: a few ms)."""
    global _spin_count
    if _spin_count is None:
        _spin_count = spin_count_for(yield_s())
    return _spin_count


def spin_count_for(seconds_per_yield: float) -> int:
    """The yields that take ``SPIN_S`` at ``seconds_per_yield`` each, within ``_SPIN_RANGE``."""
    return max(_SPIN_RANGE[0], min(_SPIN_RANGE[1], round(SPIN_S / seconds_per_yield)))


def yield_s(calls: int = 20_000, clock: Callable[[], float] = time.perf_counter,
            pause: Callable[[], None] = os.sched_yield) -> float:
    """Seconds one ``pause`` (a yield of the core) takes: a loop of ``calls`` of them less the same
    loop calling a builtin that does nothing, at least 1 ns."""
    start = clock()
    for _ in range(calls):
        pause()
    middle = clock()
    for _ in range(calls):
        int()
    return max((middle - start) - (clock() - middle), 1e-9 * calls) / calls


def configure_threads() -> None:
    """Set the thread pool's defaults where the user set nothing; a no-op once the pool has started."""
    if not os.environ.get("TVM_NUM_THREADS") and not os.environ.get("OMP_NUM_THREADS"):
        os.environ["TVM_NUM_THREADS"] = str(physical_cores())
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    if "TVM_THREAD_POOL_SPIN_COUNT" not in os.environ:
        os.environ["TVM_THREAD_POOL_SPIN_COUNT"] = str(spin_count())


def pool_threads() -> int:
    """The threads a thread pool runs (the caller's included), as TVM counts them once configured."""
    for name in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(name, "").strip().isdigit() and int(os.environ[name]) > 0:
            return int(os.environ[name])
    return physical_cores()
