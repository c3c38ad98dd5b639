"""GFLOP/s of the packed dense kernel (passes/dense.py, schedules/cpu/dense.py) per register tile.

    .venv/bin/python -m tools.experiments.dense_tiles                       # this CPU, the ViT/BERT shapes
    .venv/bin/python -m tools.experiments.dense_tiles -t '{"kind": "llvm", "mcpu": "znver3", "num-cores": 2}'
    .venv/bin/python -m tools.experiments.dense_tiles --cold                # weights flushed from the caches

The numbers behind ``register_tile``'s preferences (its docstring). Each tile
(rows x vectors of the panel) is the real kernel: ``dense_packed`` scheduled by the ``Dense`` rule,
built for the target; the tile ``register_tile`` picks is starred. Times are medians of runs taken in
turns, with x hot (the activation its producer just wrote) and the weights hot, or with ``--cold``
flushed before each run as in a model whose weights exceed the caches.
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np
import tvm
from tvm import te

from relaxc.passes.dense import dense_packed, register_tile
from relaxc.schedules.cpu.dense import Dense
from relaxc.support import targets

SHAPES = ((197, 3072, 768), (197, 768, 3072), (197, 768, 768), (128, 256, 1024))
TILES = ((8, 2), (8, 3), (6, 4), (6, 2), (4, 3))  # (rows, vectors)
ROUNDS = 4


def _kernel(m: int, k: int, n: int, rows: int, panel: int, target: tvm.target.Target):
    data = te.placeholder((m, k), name="x")
    packed = te.placeholder((-(-n // panel), k, panel), name="w")
    out = dense_packed(data, packed, n, rows)
    func = te.create_prim_func([data, packed, out])
    return tvm.compile(Dense().schedule(func, targets.vector_unit(target)).mod, target=target)


def measure(m: int, k: int, n: int, target: tvm.target.Target, cold: bool) -> dict[tuple[int, int], float]:
    """GFLOP/s of each tile of ``TILES`` for an m x k by k x n product."""
    lanes = targets.vector_lanes(target)
    rng = np.random.default_rng(0)
    device = tvm.cpu()
    runs = {}
    for rows, vectors in TILES:
        panel = vectors * lanes
        lib = _kernel(m, k, n, rows, panel, target)
        args = [tvm.runtime.tensor(rng.standard_normal((m, k)).astype("float32"), device),
                tvm.runtime.tensor(rng.standard_normal((-(-n // panel), k, panel)).astype("float32"), device),
                tvm.runtime.tensor(np.zeros((m, n), "float32"), device)]
        runs[(rows, vectors)] = (lib, args, [])
    for _ in range(ROUNDS):
        for lib, args, times in runs.values():
            timer = lib.mod.time_evaluator("main", device, number=1 if cold else 10, repeat=5,
                                           f_preproc="cache_flush_cpu_non_first_arg" if cold else "")
            times += timer(*args).results
    return {tile: 2 * m * k * n / statistics.median(times) / 1e9 for tile, (_, _, times) in runs.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-t", "--target", default="cpu", help="cpu (this machine), or a JSON dict")
    parser.add_argument("--cold", action="store_true", help="flush the weights from the caches before each run")
    args = parser.parse_args(argv)
    os.environ.setdefault("TVM_NUM_THREADS", "2")
    target = targets.resolve(args.target)
    lanes, registers = targets.vector_lanes(target), targets.vector_registers(target)
    print(f"# target {args.target} (mcpu {targets.describe(target).get('mcpu')}), {lanes} lanes, {registers} "
          f"vector registers, {os.environ['TVM_NUM_THREADS']} threads, weights {'cold' if args.cold else 'hot'}; "
          "GFLOP/s, * = register_tile's choice\n")
    print("| product | " + " | ".join(f"{r}x{v}" for r, v in TILES) + " |")
    print("| --- |" + " ---: |" * len(TILES))
    for m, k, n in SHAPES:
        gflops = measure(m, k, n, target, args.cold)
        chosen = register_tile(n, lanes, registers)
        cells = [f"{gflops[t]:.0f}{'*' if (chosen.rows, chosen.vectors) == t else ''}" for t in TILES]
        print(f"| {m}x{k} by {k}x{n} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
