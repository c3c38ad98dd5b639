"""The benchmark behind docs/benchmarks.md: relaxc against onnxruntime, same run, same threads.

    .venv/bin/python -m relaxc.benchmarks.bench [onnx:resnet50 ...] [--repeat 20] [--threads 2] [compile options]
    relaxc-bench ...   # the same, installed as a command

Prints a Markdown table (benchmarks/harness.py says how it measures).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from relaxc.benchmarks import harness
from relaxc.cli import add_option_args, option_values, run_command
from relaxc.options import Options
from relaxc.support.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relaxc-bench", description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="models (default: the nine bundled ones)")
    parser.add_argument("-t", "--target", default="cpu", help="cpu (default, this machine), llvm, or a JSON dict")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs of each runtime (default 20)")
    parser.add_argument("--threads", type=int, default=2, help="threads for both runtimes (default 2)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    add_option_args(parser, Options)
    return parser


def _bench(args: argparse.Namespace) -> int:
    if args.repeat < 1 or args.threads < 1:
        raise UserError("--repeat and --threads must be at least 1")
    harness.run(args.models, repeat=args.repeat, threads=args.threads, target=args.target,
                print_fn=lambda line: print(line, flush=True), **option_values(args, Options))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command("relaxc-bench", lambda: _bench(args), args.quiet)


if __name__ == "__main__":
    sys.exit(main())
