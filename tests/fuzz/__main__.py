"""Differential fuzzing of relaxc against onnxruntime (docs/fuzzing.md).

    .venv/bin/python -m tests.fuzz --graphs 1000 --seed 0 [--quantized [QOperator]] [--int8-activations] [--save DIR]

Graph ``i`` comes from seed ``S + i`` (``tests/fuzz/generate.py``), so any finding is reproduced by
its seed alone; with ``--quantized`` each graph is quantized by onnxruntime's tool first (QDQ, or
QOperator format with ``--quantized QOperator``; int8 activations with ``--int8-activations``) and
compared as ``check.assert_quantized_matches`` says. Each graph runs in a worker process limited
in time and memory (``check.TIMEOUT_S``, ``check.MEMORY_BYTES``). Each failure (wrong answer, internal error, crash, hang) is shrunk to a
minimal graph and saved under ``--save`` for a regression test in ``tests/fuzz_cases/``. Exit
status 1 if any failed.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import re
import sys
import time

import onnx
from tqdm import tqdm

from tests.fuzz.check import FAILURES, KINDS, check_in, worker
from tests.fuzz.generate import random_graph, random_quantized_graph
from tests.fuzz.shrink import shrink


def _reason(detail: str) -> str:
    """A refusal's message without its names and numbers, to count refusals by cause."""
    return re.sub(r"'[^']*'|\[[^\]]*\]|\d+(\.\d+)?", "_", detail)[:160]


def fuzz(graphs: int, seed: int, save: str | None, max_ops: int = 10, progress: bool = True,
         quantized: str | None = None, target: str = "cpu", activations: str = "uint8") -> dict:
    """Run the fuzzer (relaxc compiling for ``target``; graphs ``quantized`` in that format, QDQ or
    QOperator, with ``activations`` uint8 or int8, if given); returns counts by outcome and the
    failures (seed, outcome, saved path)."""
    counts: collections.Counter[str] = collections.Counter({kind: 0 for kind in KINDS})
    failures, refusals, peak_mb = [], collections.Counter(), 0.0
    isolated = worker()
    isolated_check = functools.partial(check_in, isolated, target=target)
    start = time.perf_counter()
    try:
        for graph_seed in tqdm(range(seed, seed + graphs), desc="fuzz", unit="graph", disable=not progress):
            try:
                model = (random_quantized_graph(graph_seed, max_ops, quantized, activations) if quantized
                         else random_graph(graph_seed, max_ops))
            except Exception as err:  # noqa: BLE001 - onnxruntime's quantizer could not take the graph
                counts["reference"] += 1
                tqdm.write(f"seed {graph_seed}: not quantized: {type(err).__name__}: {err}"[:300])
                continue
            outcome = isolated_check(model)
            counts[outcome.kind] += 1
            peak_mb = max(peak_mb, outcome.peak_mb)
            if outcome.kind == "refused":
                refusals[_reason(outcome.detail)] += 1
            if outcome.kind in FAILURES:
                small = shrink(model, outcome, isolated_check)
                path = None
                if save:
                    os.makedirs(save, exist_ok=True)
                    small.doc_string = json.dumps({"seed": graph_seed, "found": outcome.kind,
                                                   "detail": outcome.detail, "expect": "match"})
                    path = os.path.join(save, f"{outcome.kind}-seed{graph_seed}.onnx")
                    onnx.save(small, path)
                failures.append({"seed": graph_seed, "kind": outcome.kind, "detail": outcome.detail,
                                 "nodes": [n.op_type for n in small.graph.node], "saved": path})
                tqdm.write(f"seed {graph_seed}: {outcome.kind}: {outcome.detail[:200]}\n"
                           f"  shrunk to {len(small.graph.node)} node(s): {failures[-1]['nodes']}"
                           + (f", saved {path}" if path else ""))
    finally:
        isolated.close()
    return {"graphs": graphs, "seed": seed, "seconds": round(time.perf_counter() - start, 1),
            "counts": dict(counts), "refusals": dict(refusals), "failures": failures, "peak_mb": peak_mb}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=100, help="graphs to generate (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first graph (default 0)")
    parser.add_argument("--max-ops", type=int, default=10, help="generator steps per graph (default 10)")
    parser.add_argument("--save", default="fuzz-findings", help="where shrunk failures go (default ./fuzz-findings)")
    parser.add_argument("--quantized", nargs="?", const="QDQ", choices=("QDQ", "QOperator"),
                        help="quantize each graph with onnxruntime's tool: QDQ (the default) or QOperator format")
    parser.add_argument("--int8-activations", dest="activations", action="store_const", const="int8",
                        default="uint8", help="with --quantized: int8 activations instead of uint8")
    parser.add_argument("-t", "--target", default="cpu",
                        help="relaxc's target: cpu (this machine) or, as a JSON dict, an LLVM CPU this one runs")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    summary = fuzz(args.graphs, args.seed, args.save, args.max_ops, quantized=args.quantized, target=args.target,
                   activations=args.activations)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{summary['graphs']} graphs from seed {summary['seed']} in {summary['seconds']} s: " +
              ", ".join(f"{n} {kind}" for kind, n in summary["counts"].items()) +
              f"; the worker's peak resident memory {summary['peak_mb']:.0f} MB")
        for reason, n in sorted(summary["refusals"].items(), key=lambda kv: -kv[1]):
            print(f"  refused x{n}: {reason}")
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
