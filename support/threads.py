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
  took 15.1 ms instead of 3.9 (Zen 3, 2 cores). ``SPIN_COUNT`` yields bridge the gaps between one
  inference's kernels and stop within a millisecond: relaxc's own MobileNetV2, BERT, SqueezeNet,
  EfficientNet-B0 and ResNet-18 ran as fast as with TVM's default (medians of three processes each,
  0.95-0.98x), where no spinning at all cost MobileNetV2 up to 1.3x.
"""

from __future__ import annotations

import os


def physical_cores() -> int:
    """Physical cores (hyper-threads share a core's vector units, so kernels do not gain from them)."""
    import psutil

    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


SPIN_COUNT = 2000  # yields of an idle TVM worker before it sleeps (TVM's default: 300,000)


def configure_threads() -> None:
    """Set the thread pool's defaults where the user set nothing; a no-op once the pool has started."""
    if not os.environ.get("TVM_NUM_THREADS") and not os.environ.get("OMP_NUM_THREADS"):
        os.environ["TVM_NUM_THREADS"] = str(physical_cores())
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", str(SPIN_COUNT))


def pool_threads() -> int:
    """The threads a thread pool runs (the caller's included), as TVM counts them once configured."""
    for name in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(name, "").strip().isdigit() and int(os.environ[name]) > 0:
            return int(os.environ[name])
    return physical_cores()
