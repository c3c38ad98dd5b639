"""Two builds of one model against each other and onnxruntime, in one process (``python -m tools.experiments.ab``).

    .venv/bin/relaxc compile onnx:resnet50 --tuning strict -o /tmp/before.so   # in the old tree
    .venv/bin/relaxc compile onnx:resnet50 --tuning strict -o /tmp/after.so    # in the new one
    .venv/bin/python -m tools.experiments.ab onnx:resnet50 /tmp/before.so /tmp/after.so [--rounds 3]

Runs in separate processes minutes apart measure a VM's swings more than a change (onnxruntime's
ResNet-50 read 31.8 to 48.8 ms in consecutive runs on a 2-core VM). Here both builds and
onnxruntime take turns in blocks (``harness.alternate``), one line per round; then every kernel of
both builds is timed in model order (``benchmarks.by_op``: caches as the model leaves them), the
builds taking turns, and the kernels whose time differs most are listed, so a change's own kernels
can be read against the drift of the unchanged ones (kernels are matched by name: a change that
renames one lists it twice, each with 0 on the other side).

One run is not enough: kernels take turns every inference, which evens out a VM's steps in speed,
but two copies of one build still differ by up to 8 % in one run (their memory's placement,
likely). Run it several times in both orders and trust a kernel that moves the same way in every
run.
"""

from __future__ import annotations

import argparse
import collections
import statistics

import onnx

import relaxc
from relaxc.benchmarks import by_op, harness, reference
from relaxc import frontend
from relaxc.build.profile import model_calls
from relaxc.runtime.runner import random_inputs
from relaxc.schedules.sequence import is_builtin, time_in_order

SHOWN = 12  # kernels listed, largest difference first


def checked_session(spec: str | onnx.ModelProto, builds: dict[str, relaxc.Deployed], inputs: dict):
    """An onnxruntime session of the model, after every build's outputs were checked against it."""
    session = reference.ort_session(frontend.load_model(spec)[0])
    expected = session.run(None, inputs)
    for build in builds.values():
        reference.assert_matches(build.run(inputs), expected)
    return session


def whole_model(builds: dict[str, relaxc.Deployed], session, inputs: dict, repeat: int) -> dict[str, float]:
    """Median milliseconds of each build and of onnxruntime, taking turns in blocks."""
    runs = {name: (lambda b=build: b.run(inputs)) for name, build in builds.items()}
    runs["onnxruntime"] = lambda: session.run(None, inputs)
    return harness.alternate(runs, repeat)


def by_kernel(builds: dict[str, relaxc.Deployed], inputs: dict, rounds: int) -> dict[str, dict[str, float]]:
    """Per build, each kernel's milliseconds per inference (the sum of its calls' medians), the
    kernels timed one by one in model order, ``by_op.RUNS`` inferences per round, the builds taking
    turns every inference, the first one first every other time: a step in the VM's speed then
    falls on both builds alike (with turns of ten inferences, four copies of one build read
    29.5-37.8 ms on a 2-core VM; both builds run on TVM's one thread pool, so turns this short do
    not make two pools fight)."""
    calls = {name: [c for c in model_calls(build, inputs)[1] if not is_builtin(c[0])]
             for name, build in builds.items()}
    times = {name: collections.defaultdict(list) for name in builds}
    order = list(calls.items())
    for turn in range(rounds * by_op.RUNS):
        for name, sequence in (order if turn % 2 == 0 else order[::-1]):
            time_in_order(sequence, times[name], runs=1)
    result: dict[str, dict[str, float]] = {}
    for name, sequence in calls.items():
        per_kernel: dict[str, float] = collections.defaultdict(float)
        for i, (symbol, _, _) in enumerate(sequence):
            per_kernel[symbol] += statistics.median(times[name][i]) * 1e3
        result[name] = dict(per_kernel)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("first", help="an exported build (.so with its .json manifest)")
    parser.add_argument("second")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=40, help="inferences per runtime and round")
    args = parser.parse_args()
    builds = {"first": relaxc.load(args.first), "second": relaxc.load(args.second)}
    inputs = random_inputs(builds["first"].inputs, high=builds["first"].input_high)
    print(f"{args.model}: first {args.first}, second {args.second}, 2 threads both, median of {args.repeat}\n")
    print("| round | first (ms) | second (ms) | onnxruntime (ms) | first / ort | second / ort |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    session = checked_session(args.model, builds, inputs)
    for round_ in range(1, args.rounds + 1):
        ms = whole_model(builds, session, inputs, args.repeat)
        ort = ms["onnxruntime"]
        print(f"| {round_} | {ms['first']:.2f} | {ms['second']:.2f} | {ort:.2f} | {ms['first'] / ort:.3f} "
              f"| {ms['second'] / ort:.3f} |")
    kernels = by_kernel(builds, inputs, 2 * args.rounds)
    first, second = kernels["first"], kernels["second"]
    names = sorted(set(first) | set(second), key=lambda k: -abs(second.get(k, 0.0) - first.get(k, 0.0)))
    print(f"\nKernels in model order, median of {2 * args.rounds * by_op.RUNS} inferences each (ms per inference)\n")
    print("| kernel | first | second | second - first |\n| --- | ---: | ---: | ---: |")
    for name in names[:SHOWN]:
        a, b = first.get(name, 0.0), second.get(name, 0.0)
        print(f"| {name} | {a:.3f} | {b:.3f} | {b - a:+.3f} |")
    a, b = sum(first.values()), sum(second.values())
    print(f"| all kernels | {a:.2f} | {b:.2f} | {b - a:+.2f} |")


if __name__ == "__main__":
    main()
