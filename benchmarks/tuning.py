"""The tuning table behind docs/benchmarks.md: what the committed records buy, and what replaying
them costs at compile time.

    .venv/bin/python -m benchmarks.tuning [onnx:resnet50 ...] [--repeat 20] [--compiles 3]

For each model: compile time with ``tuning="off"`` and ``tuning="strict"`` (records from
``tuning_logs/``), alternating, median of ``--compiles`` each in one process; then both builds are
checked against onnxruntime and timed with onnxruntime in alternating blocks (median of
``--repeat`` runs each, 2 threads for all three).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TVM_NUM_THREADS", "2")

import compiler  # noqa: E402
from compiler import bench, frontend, reference  # noqa: E402

TARGET = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}  # what tuning_logs/llvm-znver3-2c is for
DEFAULT_MODELS = ["onnx:resnet50", "onnx:squeezenet", "onnx:inception_v2"]


def _compile_seconds(spec: str, compiles: int, log_dir: str) -> dict[str, tuple[float, object]]:
    times: dict[str, list[float]] = {"off": [], "strict": []}
    built = {}
    for _ in range(compiles):
        for mode in times:
            start = time.perf_counter()
            built[mode] = compiler.compile(spec, target=TARGET, tuning=mode, cache_dir=log_dir)
            times[mode].append(time.perf_counter() - start)
    return {mode: (statistics.median(t), built[mode]) for mode, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--compiles", type=int, default=3)
    parser.add_argument("--log-dir", default="tuning_logs", help="records root (default: tuning_logs)")
    args = parser.parse_args(argv)
    print("| model | compile off (s) | compile strict (s) | ratio | default (ms) | tuned (ms) "
          "| onnxruntime (ms) | tuned / onnxruntime |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for spec in args.models:
        compiled = _compile_seconds(spec, args.compiles, args.log_dir)
        (off_s, off), (strict_s, tuned) = compiled["off"], compiled["strict"]
        session = reference.ort_session(frontend.load_model(spec)[0], threads=2)
        inputs = reference.random_inputs(off.inputs)
        expected = session.run(None, inputs)
        reference.assert_matches(off.run(inputs), expected)
        reference.assert_matches(tuned.run(inputs), expected)
        runs = {"off": lambda: off.run(inputs), "tuned": lambda: tuned.run(inputs),
                "ort": lambda: session.run(None, inputs)}
        ms = bench.alternate(runs, args.repeat)
        print(f"| {spec.removeprefix('onnx:')} | {off_s:.1f} | {strict_s:.1f} | {strict_s / off_s:.2f}x "
              f"| {ms['off']:.1f} | {ms['tuned']:.1f} | {ms['ort']:.1f} | {ms['tuned'] / ms['ort']:.2f}x |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
