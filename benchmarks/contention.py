"""relaxc against onnxruntime with one of the cores shared (``python -m relaxc.benchmarks.contention``).

    .venv/bin/relaxc compile onnx:resnet50 --tuning strict --backends rule -o /tmp/r50.so
    .venv/bin/python -m relaxc.benchmarks.contention /tmp/r50.so onnx:resnet50 [--rounds 5]

Each round times three runtimes taking turns in blocks (``harness.alternate``), 2 threads each: the
build with relaxc's parallel launcher (``compiler/runtime/launcher.py``), the same build with TVM's
thread pool, and onnxruntime; first with the second core free, then with a busy loop pinned to it
(another process on the machine, or a VM's vCPU descheduled). The summary gives the medians over
the rounds and what the launcher is judged by: how much the busy core costs each runtime against
onnxruntime, and the launcher's unloaded latency against TVM's pool.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import relaxc
from relaxc import frontend
from relaxc.benchmarks import harness, reference
from relaxc.benchmarks.bench import cpu_model
from relaxc.runtime.runner import manifest_path_for, random_inputs
from relaxc.support.targets import host_cpu

BUSY = "while True: pass"
RUNTIMES = ("relaxc", "relaxc, TVM's pool", "onnxruntime")


def _copy(build: str, folder: str) -> str:
    """The build under another path: TVM's loader resets the launcher of every load of one path."""
    library = os.path.join(folder, os.path.basename(build))
    shutil.copy(build, library)
    shutil.copy(manifest_path_for(build), manifest_path_for(library))
    return library


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", help="an exported CPU build (.so with its .json manifest)")
    parser.add_argument("model", help="the model it was compiled from (the onnxruntime side)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=20, help="inferences per runtime, state and round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        claimed = relaxc.load(args.build)
        even = relaxc.load(_copy(args.build, folder), parallel="tvm")
        if (claimed.launcher, even.launcher) != ("relaxc", "tvm"):
            sys.exit(f"{args.build}: its parallel loops run on {claimed.launcher!r}, not relaxc's launcher; "
                     f"export it again")
        inputs = random_inputs(claimed.inputs, high=claimed.input_high)
        session = reference.ort_session(frontend.load_model(args.model)[0])
        expected = session.run(None, inputs)
        for build in (claimed, even):
            reference.assert_matches(build.run(inputs), expected)
        runs = dict(zip(RUNTIMES, (lambda: claimed.run(inputs), lambda: even.run(inputs),
                                   lambda: session.run(None, inputs))))
        mcpu = claimed.manifest["target"].get("mcpu", "?")
        print(f"{args.model} on {cpu_model()} (LLVM {host_cpu()}), build for {mcpu}, 2 threads each, "
              f"medians of {args.repeat} runs per round\n")
        print("| round | second core | " + " | ".join(f"{name} (ms)" for name in RUNTIMES) + " |\n| ---: | --- |"
              + " ---: |" * len(RUNTIMES))
        ms: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for round_ in range(1, args.rounds + 1):
            for busy in (False, True):
                loop = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", BUSY]) if busy else None
                time.sleep(0.5)
                try:
                    ms[busy].append(harness.alternate(runs, args.repeat))
                finally:
                    if loop is not None:
                        loop.kill()
                        loop.wait()
                print(f"| {round_} | {'busy loop' if busy else 'free'} | "
                      + " | ".join(f"{ms[busy][-1][name]:.2f}" for name in RUNTIMES) + " |", flush=True)
    median = {busy: {name: statistics.median(r[name] for r in rounds) for name in RUNTIMES}
              for busy, rounds in ms.items()}
    print("\n| runtime | free (ms) | busy (ms) | busy / free | to onnxruntime, free | to onnxruntime, busy "
          "| busy over free, to onnxruntime |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in RUNTIMES:
        free, busy = median[False][name], median[True][name]
        to_ort = [free / median[False]["onnxruntime"], busy / median[True]["onnxruntime"]]
        print(f"| {name} | {free:.2f} | {busy:.2f} | {busy / free:.2f}x | {to_ort[0]:.3f}x | {to_ort[1]:.3f}x "
              f"| {to_ort[1] / to_ort[0]:.3f}x |")
    unloaded = [r["relaxc"] / r["relaxc, TVM's pool"] for r in ms[False]]
    print(f"\nUnloaded, relaxc's launcher against TVM's pool: {statistics.median(unloaded):.3f}x "
          f"(rounds: {', '.join(f'{u:.3f}' for u in unloaded)})")


if __name__ == "__main__":
    main()
