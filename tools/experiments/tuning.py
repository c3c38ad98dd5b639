"""What the committed tuning records buy, and what replaying them costs at compile time.

    .venv/bin/python -m tools.experiments.tuning [onnx:resnet50 ...] [--repeat 20] [--compiles 3]
    .venv/bin/python -m tools.experiments.tuning onnx:resnet50 --selection 12   # what the selection chose

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


import relaxc  # noqa: E402
from relaxc.benchmarks import harness, reference  # noqa: E402
from relaxc import frontend  # noqa: E402
from relaxc.runtime.runner import random_inputs  # noqa: E402
from relaxc.schedules.cache import RecordStore, workload_hash  # noqa: E402
from relaxc.schedules.tuning import tuning_tasks  # noqa: E402

TARGET = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}  # what tuning_logs/llvm-znver3-2c is for
DEFAULT_MODELS = ["onnx:resnet50", "onnx:squeezenet", "onnx:inception_v2"]


def _compile_seconds(spec: str, compiles: int, cache_dir: str) -> dict[str, tuple[float, object]]:
    times: dict[str, list[float]] = {"off": [], "strict": []}
    built = {}
    for _ in range(compiles):
        for mode in times:
            start = time.perf_counter()
            built[mode] = relaxc.compile(spec, target=TARGET, tuning=mode, cache_dir=cache_dir)
            times[mode].append(time.perf_counter() - start)
    return {mode: (statistics.median(t), built[mode]) for mode, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--compiles", type=int, default=3)
    parser.add_argument("--cache-dir", default="tuning_logs", help="the cache (default: tuning_logs)")
    parser.add_argument("--selection", type=int, metavar="N",
                        help="instead: the N kernels of each model that take longest with default schedules, "
                             "as the selection measured them")
    args = parser.parse_args(argv)
    if args.selection:
        for spec in args.models:
            _print_selection(spec, args.selection, args.cache_dir)
        return 0
    print("| model | compile off (s) | compile strict (s) | ratio | default (ms) | tuned (ms) "
          "| onnxruntime (ms) | tuned / onnxruntime |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for spec in args.models:
        compiled = _compile_seconds(spec, args.compiles, args.cache_dir)
        (off_s, off), (strict_s, tuned) = compiled["off"], compiled["strict"]
        session = reference.ort_session(frontend.load_model(spec)[0], threads=2)
        inputs = random_inputs(off.inputs)
        expected = session.run(None, inputs)
        reference.assert_matches(off.run(inputs), expected)
        reference.assert_matches(tuned.run(inputs), expected)
        runs = {"off": lambda: off.run(inputs), "tuned": lambda: tuned.run(inputs),
                "ort": lambda: session.run(None, inputs)}
        ms = harness.alternate(runs, args.repeat)
        print(f"| {spec.removeprefix('onnx:')} | {off_s:.1f} | {strict_s:.1f} | {strict_s / off_s:.2f}x "
              f"| {ms['off']:.1f} | {ms['tuned']:.1f} | {ms['ort']:.1f} | {ms['tuned'] / ms['ort']:.2f}x |",
              flush=True)
    return 0


def _print_selection(spec: str, count: int, cache_dir: str) -> None:
    """The kernels of ``spec`` with the most default-schedule time per inference: what won, against
    the default, as ``selected.json`` records it (cold-cache milliseconds per run, build seconds)."""
    art = relaxc.compile(spec, target=TARGET, tuning="off", cache_dir=cache_dir)
    chosen = RecordStore.of(cache_dir, art.target).selections()
    tasks = [(t, chosen.get(workload_hash(t.dispatched[0])))
             for t in tuning_tasks(art.module("fuse"), art.target)]
    decided = sorted(((t, e) for t, e in tasks if e), key=lambda te: -float(te[0].weight) * te[1]["default_ms"])
    print(f"\n{spec}: {len(decided)} of {len(tasks)} kernels selected; the {count} slowest with default schedules\n")
    print("| kernel | runs | choice | ms | default ms | build s | default build s | candidates |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for task, e in decided[:count]:
        print(f"| {task.task_name} | {int(task.weight)} | {e['choice']} | {e['ms']:.3f} | {e['default_ms']:.3f} "
              f"| {e['build_s']:.2f} | {e['default_build_s']:.2f} | {e['candidates']} |")
    total = {key: sum(float(t.weight) * e[key] for t, e in decided) for key in ("ms", "default_ms")}
    builds = {key: sum(e[key] for _, e in decided) for key in ("build_s", "default_build_s")}
    print(f"\nall selected kernels, weighted by runs per inference: {total['ms']:.1f} ms chosen against "
          f"{total['default_ms']:.1f} ms default; built one by one in {builds['build_s']:.1f} s against "
          f"{builds['default_build_s']:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
