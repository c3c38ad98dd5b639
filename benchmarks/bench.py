"""The benchmark behind docs/benchmarks.md; the same as ``relaxc bench`` (see compiler/bench.py).

    .venv/bin/python -m benchmarks.bench [onnx:resnet50 ...] [--repeat 20]
"""

import sys

from compiler.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
