"""How a kernel runs in the model against warm or cold caches (``python -m tools.experiments.cache_state``).

    .venv/bin/python -m tools.experiments.cache_state onnx:resnet50 "fused_conv2d_NCHWc13_*" [--tuning strict]

Each call of the kernels whose names match, on the model's own arguments (``relaxc.build.profile.model_calls``),
timed four ways, median of ``--rounds``: right after the call before it in the model (as in an
inference), right after itself (weights and input warm), after sweeping 64 MB through the caches,
and after the call before it and a 2 ms pause (the thread pool's workers gone to sleep). Says
whether a kernel's time in sequence is its cold-cache time and whether waking the pool costs.
"""

from __future__ import annotations

import argparse
import fnmatch
import statistics
import time

import numpy as np
import onnx

import relaxc
from relaxc.build.profile import model_calls
from relaxc.runtime.runner import random_inputs

SWEEP_BYTES = 64 << 20  # more than this VM's L3 share


def _seconds(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def cache_states(spec: str | onnx.ModelProto, pattern: str, rounds: int, **options) -> tuple[dict[str, float], int]:
    """Median milliseconds of one matching call in each state, and how many calls match."""
    art = relaxc.compile(spec, **options)
    _vm, calls = model_calls(art, random_inputs(art.inputs, high=art.input_high))
    chosen = [i for i, (symbol, _, _) in enumerate(calls) if i and fnmatch.fnmatchcase(symbol, pattern)]
    if not chosen:
        raise SystemExit(f"no kernel matches {pattern}")
    sweep = np.zeros(SWEEP_BYTES, np.uint8)
    times: dict[str, list[float]] = {state: [] for state in ("after its predecessor", "after itself",
                                                             "after a cache sweep", "after a 2 ms pause")}
    for _ in range(rounds):
        for i in chosen:
            run = lambda i=i: calls[i][1](*calls[i][2])  # noqa: E731
            before = lambda i=i: calls[i - 1][1](*calls[i - 1][2])  # noqa: E731
            before()
            times["after its predecessor"].append(_seconds(run))
            times["after itself"].append(_seconds(run))
            sweep += 1
            times["after a cache sweep"].append(_seconds(run))
            before()
            time.sleep(0.002)
            times["after a 2 ms pause"].append(_seconds(run))
    return {state: statistics.median(t) * 1e3 for state, t in times.items()}, len(chosen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("kernels", help="glob pattern of kernel names")
    parser.add_argument("--tuning", default="replay", choices=["off", "replay", "strict"])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    states, count = cache_states(args.model, args.kernels, args.rounds, tuning=args.tuning)
    print(f"{args.model}, {count} calls of {args.kernels}, median ms per call of {args.rounds * count}:")
    for state, ms in states.items():
        print(f"{state:>22}: {ms:.3f}")


if __name__ == "__main__":
    main()
