"""A decoder artifact's footprint: its files against the ONNX model, its compile time, and the peak
memory of generating with it.

    .venv/bin/python -m relaxc.benchmarks.footprint [SPEC ...] [--max-length 1072]

For each decoder with past (default: ``benchmarks/generation.py``'s): compile with ``max_length``
(timed), export (library, manifest, weights) and compare the files' bytes with the ONNX model's
(its weights filled in: the model a user has); then, in a fresh process, ``relaxc.load`` the export
and generate from a 32-token prompt up to ``max_length``, and report the peak resident memory above
what the process held after ``import relaxc`` against the weights + the cache (batch 1) + 64 MiB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Sequence

import onnx

from relaxc.benchmarks.bench import this_cpu
from relaxc.benchmarks.generation import SPECS
from relaxc.frontend import models
from relaxc.support.cache_layout import CacheLayout

MIB = 2 ** 20
PROMPT = 32
GENERATE = """
import sys
import numpy as np

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

import relaxc
base = status("VmRSS")
art = relaxc.load(sys.argv[1])
prompt = np.random.default_rng(0).integers(0, art.decoder["vocab"], (1, {prompt}))
art.generate(prompt, max_new_tokens=art.decoder["max_length"] - {prompt})
print(status("VmHWM") - base)
"""


def footprint(spec: str, max_length: int) -> dict:
    """The compile seconds, ONNX and export bytes, and the peak memory above import of ``spec``."""
    import relaxc

    started = time.perf_counter()
    art = relaxc.compile(spec, max_length=max_length, backends="relaxc")
    seconds = time.perf_counter() - started
    onnx_bytes = models.fill_light(onnx.load(models.bundled_path(spec))).ByteSize()
    with tempfile.TemporaryDirectory() as folder:
        art.export(os.path.join(folder, "decoder.so"))
        files = sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder))
        weights = os.path.getsize(os.path.join(folder, "decoder.weights"))
        peak = int(subprocess.run([sys.executable, "-c", GENERATE.format(prompt=PROMPT), os.path.join(folder, "decoder.so")],
                                  check=True, capture_output=True, text=True).stdout.split()[-1])
    cache = CacheLayout.from_json(art.decoder["cache"]).bytes(1)
    return {"seconds": seconds, "onnx": onnx_bytes, "files": files, "peak": peak, "budget": weights + cache + 64 * MIB}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", default=list(SPECS), help="decoders with past (default: %(default)s)")
    parser.add_argument("--max-length", type=int, default=1072, help="tokens a sequence holds (default 1072)")
    args = parser.parse_args(argv)
    print(f"# {this_cpu('cpu')}, target cpu, fp32, max_length {args.max_length}, batch 1\n\n"
          "| model | compile (s) | ONNX (MB) | export (MB) | ratio | peak above import (MiB) | weights + cache + 64 (MiB) |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: |", flush=True)
    for spec in args.specs:
        f = footprint(spec, args.max_length)
        print(f"| {spec} | {f['seconds']:.0f} | {f['onnx'] / 1e6:.1f} | {f['files'] / 1e6:.1f} | "
              f"{f['files'] / f['onnx']:.3f}x | {f['peak'] / MIB:.0f} | {f['budget'] / MIB:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
