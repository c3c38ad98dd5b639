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
"""

from __future__ import annotations

import os


def physical_cores() -> int:
    """Physical cores (hyper-threads share a core's vector units, so kernels do not gain from them)."""
    import psutil

    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


def configure_threads() -> None:
    """Set the thread pool's defaults where the user set nothing; a no-op once the pool has started."""
    if not os.environ.get("TVM_NUM_THREADS") and not os.environ.get("OMP_NUM_THREADS"):
        os.environ["TVM_NUM_THREADS"] = str(physical_cores())
    os.environ.setdefault("TVM_BIND_THREADS", "0")


def pool_threads() -> int:
    """The threads a thread pool runs (the caller's included), as TVM counts them once configured."""
    for name in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(name, "").strip().isdigit() and int(os.environ[name]) > 0:
            return int(os.environ[name])
    return physical_cores()
