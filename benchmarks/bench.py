"""Compile time and latency of relaxc against onnxruntime, measured in the same run.

    .venv/bin/python -m benchmarks.bench [onnx:resnet50 ...] [--repeat 20]

Both run with 2 threads; latency is the median of ``--repeat`` runs after warm-up. Prints a
Markdown table (paste it into docs/ with the command and the date).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TVM_NUM_THREADS", "2")

import numpy as np  # noqa: E402
import onnx  # noqa: E402

import compiler  # noqa: E402
from compiler import models, targets  # noqa: E402
from tests import reference  # noqa: E402


def _median_ms(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def bench(spec: str, repeat: int) -> dict:
    start = time.perf_counter()
    art = compiler.compile(spec, target="cpu")
    compile_s = time.perf_counter() - start
    inputs = reference.random_inputs(art.inputs)
    session = reference.ort_session(onnx.load(models.bundled_path(spec)), threads=2)
    reference.assert_matches(art.run(inputs), session.run(None, inputs))
    relaxc_ms = _median_ms(lambda: art.run(inputs), repeat)
    ort_ms = _median_ms(lambda: session.run(None, inputs), repeat)
    return {"model": spec, "compile_s": compile_s, "relaxc_ms": relaxc_ms, "ort_ms": ort_ms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=[f"onnx:{n}" for n in models.BUNDLED])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    import onnxruntime

    print(f"# {platform.processor() or platform.machine()}, target cpu = "
          f"{targets.host_cpu()}, TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']}, "
          f"onnxruntime {onnxruntime.__version__} (2 threads), median of {args.repeat}\n")
    print("| model | compile (s) | relaxc (ms) | onnxruntime (ms) | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for spec in args.models:
        r = bench(spec, args.repeat)
        print(f"| {r['model']} | {r['compile_s']:.1f} | {r['relaxc_ms']:.1f} | {r['ort_ms']:.1f} | "
              f"{r['relaxc_ms'] / r['ort_ms']:.1f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
