"""The graph-level layout choice model by model: what it changes and what it expects to save.

    .venv/bin/python -m tools.experiments.layout_choice STORE onnx:resnet50 zoo:googlenet ...

Compiles each model with ``layouts="measure"`` into the cache ``STORE`` (times already
there are replayed, the rest measured: run it on an idle machine), tuning off, and prints a
Markdown table: the solver's method, the plan's and the rule's modelled totals, the ops changed,
the layout phase's seconds (docs/layout_choice.md).
"""

from __future__ import annotations

import argparse
import collections
import sys

import relaxc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", help="the cache (cache_dir) to measure into and replay from")
    parser.add_argument("models", nargs="+", help="models (onnx:NAME, zoo:NAME or a path)")
    args = parser.parse_args(argv)
    print("| model | method | plan (ms, modelled) | rule (ms, modelled) | ops changed | layout phase (s) |\n"
          "| --- | --- | ---: | ---: | --- | ---: |")
    for model in args.models:
        report = relaxc.compile(model, tuning="off", layouts="measure", cache_dir=args.store).report()
        choice = report["layout"]["choice"]
        seconds = next(p["seconds"] for p in report["phases"] if p["name"] == "layout")
        changed = collections.Counter(choice["changed"].values())
        print(f"| {model} | {choice['method']} | {choice['ms']:.3f} | {choice['default_ms']:.3f} | "
              f"{', '.join(f'{n} to {layout}' for layout, n in sorted(changed.items())) or 'none'} | {seconds:.1f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
