"""Where a CNN's time goes, per kind of convolution: relaxc's kernels against onnxruntime's nodes.

    .venv/bin/python -m relaxc.benchmarks.by_op onnx:resnet50 [--tuning strict] [--rounds 3]

relaxc's kernels are timed one by one in their model order, on the VM's own arguments, so each
runs with the caches as the previous kernel left them (``relaxc profile`` times each kernel alone,
hot, which hides the weights streamed from memory: ResNet-50's kernels took 35 ms alone and 44 ms
in sequence on a 2-core VM). onnxruntime's nodes are timed by its own profiler. Both in
the same process, taking turns in rounds of 10 inferences; each kernel's or node's median counts.
Convolutions are grouped by kernel size and stride (a Winograd convolution's three kernels count as
one 3x3 stride-1 convolution), everything else by operator.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import tempfile

import onnx

import relaxc
from relaxc.benchmarks import reference
from relaxc import frontend
from relaxc.build.profile import model_calls
from relaxc.runtime.runner import random_inputs
from relaxc.schedules.sequence import is_builtin, time_in_order

RUNS = 10
# the same work under each runtime's names: relaxc kernel name prefixes and onnxruntime op types
KINDS = {"matmul": "matmul, Gemm", "dense": "matmul, Gemm", "Gemm": "matmul, Gemm", "MatMul": "matmul, Gemm",
         "FusedGemm": "matmul, Gemm", "FusedMatMul": "matmul, Gemm",
         "max": "pooling", "avg": "pooling", "adaptive": "pooling", "MaxPool": "pooling",
         "AveragePool": "pooling", "GlobalAveragePool": "pooling",
         "te": "layout transforms", "ReorderInput": "layout transforms", "ReorderOutput": "layout transforms"}


def _conv_kind(kernel: tuple[int, ...], data: tuple[int, ...], out: tuple[int, ...]) -> str:
    stride = "s2" if data[-3] > out[-3] * 1.5 else "s1"
    return f"conv {kernel[-4]}x{kernel[-3]} {stride}"


def _relaxc_kind(symbol: str, args: list) -> str:
    if "winograd" in symbol:
        return "conv 3x3 s1"
    shapes = [tuple(a.shape) for a in args if hasattr(a, "shape")]
    if "conv2d" in symbol and len(shapes) >= 3:
        return _conv_kind(shapes[1], shapes[0], shapes[-1])
    if is_builtin(symbol):
        return "VM builtins"
    name = symbol.removeprefix("fused_").split("_")[0]
    return KINDS.get(name, name)


def _ort_kinds(path: str) -> dict[str, str]:
    """Node name -> kind, from the model onnxruntime optimised (its weight shapes and strides)."""
    model = onnx.load(path)
    shapes = {i.name: tuple(i.dims) for i in model.graph.initializer}
    kinds = {}
    for node in model.graph.node:
        strides = next((list(a.ints) for a in node.attribute if a.name == "strides"), [1])
        weight = shapes.get(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        kinds[node.name] = f"conv {weight[2]}x{weight[3]} s{strides[0]}" if weight else KINDS.get(node.op_type, node.op_type)
    return kinds


def compare(spec: str | onnx.ModelProto, rounds: int, **options) -> tuple[dict[str, float], dict[str, float], float, float]:
    """Per kind, relaxc's and onnxruntime's milliseconds per inference; and each one's total."""
    model = frontend.load_model(spec)[0]
    art = relaxc.compile(spec, **options)
    inputs = random_inputs(art.inputs, high=art.input_high)
    _vm, calls = model_calls(art, inputs)
    with tempfile.TemporaryDirectory() as tmp:
        session = reference.ort_session(model, profile_prefix=os.path.join(tmp, "ort"),
                                        optimized_path=os.path.join(tmp, "optimized.onnx"))
        kinds = _ort_kinds(os.path.join(tmp, "optimized.onnx"))
        times: dict[int, list[float]] = collections.defaultdict(list)
        for _ in range(rounds):
            time_in_order(calls, times, RUNS)
            for _ in range(RUNS):
                session.run(None, inputs)
        with open(session.end_profiling()) as f:
            events = json.load(f)
    ours: dict[str, float] = collections.defaultdict(float)
    for i, (symbol, _, args) in enumerate(calls):
        ours[_relaxc_kind(symbol, args)] += statistics.median(times[i]) * 1e3
    per_node: dict[str, list[float]] = collections.defaultdict(list)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            per_node[event["name"].removesuffix("_kernel_time")].append(event["dur"] / 1e3)
    theirs: dict[str, float] = collections.defaultdict(float)
    for name, durations in per_node.items():
        theirs[kinds.get(name, name)] += statistics.median(durations)
    return ours, theirs, sum(ours.values()), sum(theirs.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--tuning", default="replay", choices=["off", "replay", "strict"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-t", "--target", default="cpu", help="as relaxc's: cpu (this machine) or a JSON dict")
    args = parser.parse_args()
    ours, theirs, our_total, their_total = compare(args.model, args.rounds, tuning=args.tuning, target=args.target,
                                                    backends="relaxc")  # relaxc's kernels, per kind
    print(f"{args.model}, target {args.target}, 2 threads both, median per kernel or node of {args.rounds * RUNS} inferences\n")
    print("| kind | relaxc (ms) | onnxruntime (ms) | ratio |\n| --- | ---: | ---: | ---: |")
    for kind in sorted(set(ours) | set(theirs), key=lambda k: -max(ours.get(k, 0), theirs.get(k, 0))):
        mine, other = ours.get(kind, 0.0), theirs.get(kind, 0.0)
        if max(mine, other) >= 0.05:
            print(f"| {kind} | {mine:.2f} | {other:.2f} | {f'{mine / other:.2f}x' if other else '-'} |")
    print(f"| all | {our_total:.2f} | {their_total:.2f} | {our_total / their_total:.2f}x |")


if __name__ == "__main__":
    main()
