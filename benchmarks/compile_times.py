"""Compile times of the bundled models from two source trees or two sets of options.

    git worktree add /tmp/before <commit>
    .venv/bin/python -m benchmarks.compile_times /tmp/before . --repeat 3 [resnet50 squeezenet ...]
    .venv/bin/python -m benchmarks.compile_times . . --before-options dispatch=off --options tuning=off

Each model is compiled ``--repeat`` times in a fresh process per side (median), the sides taking
turns model by model, so a slow spell of the machine hits both. ``--options`` apply to both sides,
``--before-options`` and ``--after-options`` to one (``compiler.compile`` keywords). Prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from compiler import models

CODE = """
import statistics, time, compiler
times = []
for _ in range({repeat}):
    start = time.perf_counter()
    compiler.compile("onnx:{name}", **{options!r})
    times.append(time.perf_counter() - start)
print(statistics.median(times))
"""


def seconds(tree: str, name: str, repeat: int, options: dict) -> float:
    """Median seconds of ``repeat`` compiles of the bundled model ``name`` in a fresh process on
    ``tree``'s sources; a compile that fails stops the comparison with its error."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    run = subprocess.run([sys.executable, "-c", CODE.format(repeat=repeat, name=name, options=options)], cwd=tree,
                         env=env, capture_output=True, text=True)
    if run.returncode != 0:
        error = (run.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"compiling onnx:{name} from {tree} with {options} failed: {error}")
    return float(run.stdout.strip().splitlines()[-1])


def _options(pairs: list[str]) -> dict:
    """KEY=VALUE pairs; a VALUE that parses as JSON (8, true) is that value, any other a string."""
    if any("=" not in pair for pair in pairs):
        raise SystemExit(f"options are KEY=VALUE, not {' '.join(pairs)}")
    return {key: _value(value) for key, value in (pair.split("=", 1) for pair in pairs)}


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="source tree to compare against")
    parser.add_argument("after", help="source tree to measure")
    parser.add_argument("models", nargs="*", default=list(models.BUNDLED), help="bundled model names")
    parser.add_argument("--repeat", type=int, default=3, help="compiles per model and side (median)")
    parser.add_argument("--options", nargs="*", default=[], metavar="KEY=VALUE", help="compile options of both sides")
    parser.add_argument("--before-options", nargs="*", default=[], metavar="KEY=VALUE", help="of the first side")
    parser.add_argument("--after-options", nargs="*", default=[], metavar="KEY=VALUE", help="of the second side")
    args = parser.parse_args(argv)
    common = _options(args.options)
    sides = [(args.before, {**common, **_options(args.before_options)}),
             (args.after, {**common, **_options(args.after_options)})]
    print("| model | before (s) | after (s) | after / before |\n| --- | ---: | ---: | ---: |")
    for name in args.models:
        before, after = (seconds(tree, name, args.repeat, options) for tree, options in sides)
        print(f"| onnx:{name} | {before:.2f} | {after:.2f} | {after / before:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
