"""The memory table behind docs/memory.md: the arena planner against the lower bound and TVM's
StaticPlanBlockMemory for every bundled model, and latency with each planner.

    .venv/bin/python -m tools.experiments.memory [onnx:resnet50 ...] [--repeat 20]

Each model is compiled with both planners; both builds are checked against onnxruntime, then timed
in alternating blocks (median of ``--repeat`` runs each, 2 threads).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TVM_NUM_THREADS", "2")

import relaxc  # noqa: E402
from relaxc.benchmarks import harness, reference  # noqa: E402
from relaxc import frontend
from relaxc.frontend import models  # noqa: E402
from relaxc.runtime.runner import random_inputs  # noqa: E402


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f}"


def _lower_seconds(art) -> float:
    return next(p["seconds"] for p in art.report()["phases"] if p["name"] == "lower")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=[f"onnx:{n}" for n in models.BUNDLED])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    print("| model | tensors | arena (MiB) | lower bound | arena / bound | TVM static plan | arena / TVM "
          "| no reuse | relaxc ms, arena | relaxc ms, TVM plan | lower phase s, arena / TVM |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for spec in args.models:
        arts = {planner: relaxc.compile(spec, memory_planner=planner) for planner in ("arena", "tvm")}
        inputs = random_inputs(arts["arena"].inputs)
        expected = reference.ort_session(frontend.load_model(spec)[0]).run(None, inputs)
        for art in arts.values():
            reference.assert_matches(art.run(inputs), expected)
        ms = harness.alternate({planner: (lambda art=art: art.run(inputs)) for planner, art in arts.items()},
                             args.repeat)
        m = arts["arena"].report()["memory"]
        print(f"| {spec} | {len(m['tensors'])} | {_mib(m['arena_bytes'])} | {_mib(m['lower_bound_bytes'])} | "
              f"{m['arena_bytes'] / m['lower_bound_bytes']:.3f} | {_mib(m['tvm_static_plan_bytes'])} | "
              f"{m['arena_bytes'] / m['tvm_static_plan_bytes']:.2f} | {_mib(m['no_reuse_bytes'])} | "
              f"{ms['arena']:.1f} | {ms['tvm']:.1f} | "
              f"{_lower_seconds(arts['arena']):.1f} / {_lower_seconds(arts['tvm']):.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
