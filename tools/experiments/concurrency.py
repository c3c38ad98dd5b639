"""Latency and throughput of concurrent ``run`` calls on one artifact (docs/concurrency.md).

    .venv/bin/python -m tools.experiments.concurrency [onnx:squeezenet ...] [--runs 40] [--threads 1 2 4 8]

For each thread count N, N Python threads share one compiled model and each calls ``run`` ``--runs``
times; the table gives the median latency of one call, the throughput of all threads together and
the resident memory growth, for the VM pool (one VM and arena per concurrent call) and for the
same pool limited to one VM (every call serialised, as a global lock would do). A call's latency
includes its wait for a VM.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import psutil

import relaxc
from relaxc.runtime.runner import Runner, random_inputs
from relaxc.support import targets
from relaxc.support.threads import configure_threads, pool_threads


def measure(runner: Runner, threads: int, runs: int) -> tuple[float, float]:
    """Median milliseconds per call and calls per second with ``threads`` threads calling at once."""
    time.sleep(1.0)  # the previous measurement's TVM workers stop spinning
    inputs = random_inputs(runner.inputs)
    latencies: list[float] = []
    barrier = threading.Barrier(threads + 1)

    def work() -> None:
        runner.run(inputs)  # warm-up: this thread's TVM worker pool starts
        barrier.wait()
        for _ in range(runs):
            start = time.perf_counter()
            runner.run(inputs)
            latencies.append((time.perf_counter() - start) * 1e3)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for thread in pool:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in pool:
        thread.join()
    return statistics.median(latencies), threads * runs / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["onnx:squeezenet", "onnx:resnet50"])
    parser.add_argument("--runs", type=int, default=40, help="calls per thread (default 40)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args(argv)
    configure_threads()
    print(f"# {targets.host_cpu()}, {psutil.cpu_count()} logical CPUs, relaxc's launcher with {pool_threads()} "
          f"threads, median of {args.runs} calls per thread\n")
    print("| model | arena (MiB) | threads | pool: ms per call | pool: calls/s | pool: RSS growth (MiB) "
          "| serialised: ms per call | serialised: calls/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for spec in args.models:
        art = relaxc.compile(spec, target="cpu")
        path = f"/tmp/relaxc-concurrency-{spec.replace(':', '_')}.so"
        art.export(path)
        arena = art.report()["memory"]["arena_bytes"] / 2**20
        for threads in args.threads:
            pooled = relaxc.load(path, concurrency=threads)
            before = psutil.Process().memory_info().rss
            pool_ms, pool_rate = measure(pooled, threads, args.runs)
            grown = (psutil.Process().memory_info().rss - before) / 2**20
            serial_ms, serial_rate = measure(relaxc.load(path, concurrency=1), threads, args.runs)
            print(f"| {spec} | {arena:.1f} | {threads} | {pool_ms:.1f} | {pool_rate:.1f} | {grown:.0f} | "
                  f"{serial_ms:.1f} | {serial_rate:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
