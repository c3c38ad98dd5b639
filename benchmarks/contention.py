"""relaxc against onnxruntime with one of the cores shared (``python -m relaxc.benchmarks.contention``).

    .venv/bin/relaxc compile onnx:resnet50 --tuning strict -o /tmp/r50.so
    .venv/bin/python -m relaxc.benchmarks.contention /tmp/r50.so onnx:resnet50 [--rounds 3]

Each round times both runtimes (2 threads each, taking turns in blocks, ``harness.alternate``)
alone, then again with a busy loop pinned to the second core (another process on the machine, or
a VM's vCPU descheduled). Why: in a VM's slow spells relaxc slows down more than onnxruntime:
a kernel whose parallel loop is split evenly between the threads waits for the slower one.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import relaxc as compiler
from relaxc.benchmarks import harness, reference
from relaxc import frontend
from relaxc.runtime import random_inputs

BUSY = "while True: pass"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", help="an exported build (.so with its .json manifest)")
    parser.add_argument("model", help="the model it was compiled from (the onnxruntime side)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20, help="inferences per runtime, state and round")
    args = parser.parse_args()
    build = compiler.load(args.build)
    inputs = random_inputs(build.inputs, high=build.input_high)
    session = reference.ort_session(frontend.load_model(args.model)[0])
    reference.assert_matches(build.run(inputs), session.run(None, inputs))
    runs = {"relaxc": lambda: build.run(inputs), "onnxruntime": lambda: session.run(None, inputs)}
    print("| round | second core | relaxc (ms) | onnxruntime (ms) | ratio |\n| ---: | --- | ---: | ---: | ---: |")
    for round_ in range(1, args.rounds + 1):
        for busy in (False, True):
            loop = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", BUSY]) if busy else None
            time.sleep(0.5)
            try:
                ms = harness.alternate(runs, args.repeat)
            finally:
                if loop is not None:
                    loop.kill()
                    loop.wait()
            print(f"| {round_} | {'busy loop' if busy else 'free'} | {ms['relaxc']:.2f} | {ms['onnxruntime']:.2f} "
                  f"| {ms['relaxc'] / ms['onnxruntime']:.3f}x |", flush=True)


if __name__ == "__main__":
    main()
