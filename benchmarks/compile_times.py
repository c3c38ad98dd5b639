"""Compile times of the bundled models from two source trees (say, before and after a refactor).

    git worktree add /tmp/before <commit>
    .venv/bin/python -m benchmarks.compile_times /tmp/before . --repeat 3 [resnet50 squeezenet ...]

Each model is compiled ``--repeat`` times in a fresh process per tree (median), the trees taking
turns model by model, so a slow spell of the machine hits both. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from compiler import models

CODE = """
import statistics, time, compiler
times = []
for _ in range({repeat}):
    start = time.perf_counter()
    compiler.compile("onnx:{name}")
    times.append(time.perf_counter() - start)
print(statistics.median(times))
"""


def seconds(tree: str, name: str, repeat: int) -> float:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    out = subprocess.run([sys.executable, "-c", CODE.format(repeat=repeat, name=name)], cwd=tree, env=env,
                         capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="source tree to compare against")
    parser.add_argument("after", help="source tree to measure")
    parser.add_argument("models", nargs="*", default=list(models.BUNDLED), help="bundled model names")
    parser.add_argument("--repeat", type=int, default=3, help="compiles per model and tree (median)")
    args = parser.parse_args(argv)
    print("| model | before (s) | after (s) | after / before |\n| --- | ---: | ---: | ---: |")
    for name in args.models:
        before, after = (seconds(tree, name, args.repeat) for tree in (args.before, args.after))
        print(f"| onnx:{name} | {before:.2f} | {after:.2f} | {after / before:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
