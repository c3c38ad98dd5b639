"""Compile times of the bundled models from two source trees or two sets of options.

    git worktree add /tmp/before <commit>
    .venv/bin/python -m tools.experiments.compile_times /tmp/before . --repeat 3 [resnet50 squeezenet ...]
    .venv/bin/python -m tools.experiments.compile_times . . --before-options dispatch=off --options tuning=off --rounds 5

Each model is compiled ``--repeat`` times in a fresh process per side (median), the sides taking
turns model by model, so a slow spell of the machine hits both; with ``--rounds N`` the pair of
processes runs N times, the side that goes first alternating, and the table gives the medians over
the rounds and every round's ratio (on the 2-core VMs the same compile varies 10-20 % from one
process to the next, so one round's ratio can be off by as much as the difference measured).
``--options`` apply to both sides, ``--before-options`` and ``--after-options`` to one
(``compiler.compile`` keywords). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from relaxc.frontend import models

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


def add_option_arguments(parser: argparse.ArgumentParser) -> None:
    """``--options`` (KEY=VALUE compile options of both sides), ``--before-options`` and ``--after-options``."""
    parser.add_argument("--options", nargs="*", default=[], metavar="KEY=VALUE", help="compile options of both sides")
    parser.add_argument("--before-options", nargs="*", default=[], metavar="KEY=VALUE", help="of the first side")
    parser.add_argument("--after-options", nargs="*", default=[], metavar="KEY=VALUE", help="of the second side")


def option_sides(args: argparse.Namespace) -> tuple[dict, dict]:
    """The compile options of the first and the second side."""
    common = _options(args.options)
    return {**common, **_options(args.before_options)}, {**common, **_options(args.after_options)}


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
    parser.add_argument("--rounds", type=int, default=1, help="processes per model and side, taking turns")
    add_option_arguments(parser)
    args = parser.parse_args(argv)
    sides = list(zip((args.before, args.after), option_sides(args)))
    print("| model | before (s) | after (s) | after / before | rounds' ratios |\n| --- | ---: | ---: | ---: | --- |")
    for name in args.models:
        rounds = []
        for number in range(args.rounds):
            times = [0.0, 0.0]
            for i in (number % 2, 1 - number % 2):  # the side that goes first alternates
                times[i] = seconds(sides[i][0], name, args.repeat, sides[i][1])
            rounds.append(times)
        before, after = (statistics.median(r[i] for r in rounds) for i in (0, 1))
        ratios = [a / b for b, a in rounds]
        print(f"| onnx:{name} | {before:.2f} | {after:.2f} | {statistics.median(ratios):.2f} | "
              f"{' '.join(f'{r:.2f}' for r in ratios)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
