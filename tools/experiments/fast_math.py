"""Accuracy and speed of relaxc's vectorised transcendental functions (passes/tir/fast_math.py).

    .venv/bin/python -m tools.experiments.fast_math           # relaxc's lowering (the table in docs/fast_math.md)
    .venv/bin/python -m tools.experiments.fast_math --tvm     # TVM's own lowering, for the speed comparison

Accuracy: every function on 2**18 float32 inputs, half random bit patterns (every exponent, both
signs, NaN payloads, subnormals), half normal values of scale 6, plus the special values, against
numpy in float64; the error in ulps is over results that are normal float32 numbers, the relative
error over all finite ones. Speed: nanoseconds per element of a parallel, vectorised loop over 2**20
inputs on this machine's CPU. tests/passes/tir/test_fast_math.py asserts the accuracy bounds.
"""

from __future__ import annotations

import argparse
import math
import platform
import time
from typing import Callable

import numpy as np
import tvm
from tvm import te

from relaxc.passes.tir import tir_pipeline
from relaxc.support import targets

N = 1 << 18
SPECIAL = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-38, 3.4028235e38, -3.4028235e38,
           88.72, 88.73, -87.3, -103.9, -104.0, 7.9, -7.9, 9.0, 4.0, -4.0, 4e-4, -4e-4, 1e-3, 0.5, -0.5]
TINY = float(np.finfo(np.float32).tiny)

# name: (TE function, float64 reference)
FUNCTIONS: dict[str, tuple[Callable, Callable]] = {
    "exp": (te.exp, np.exp),
    "log": (te.log, np.log),
    "tanh": (te.tanh, np.tanh),
    "erf": (te.erf, np.vectorize(math.erf, otypes=[np.float64])),
    "sigmoid": (te.sigmoid, lambda v: 1 / (1 + np.exp(-v))),
}


def inputs(n: int = N) -> np.ndarray:
    bits = np.random.default_rng(0).integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32).copy()
    x[: len(SPECIAL)] = SPECIAL
    x[len(SPECIAL): n // 2] = np.random.default_rng(1).standard_normal(n // 2 - len(SPECIAL)) * 6
    return x


def kernel(fn: Callable, n: int, target: tvm.target.Target, lanes: int, parallel: bool = False,
           relaxc: bool = True):
    """``y = fn(x)`` over n elements, vectorised ``lanes`` wide, built for ``target`` as relaxc
    builds kernels (its TIR pipeline: AVX-512 targets get the AVX-512 sigmoid) or, with ``relaxc``
    false, with TVM's default pipeline."""
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: fn(x[i]), name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    outer, inner = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, lanes])
    sch.vectorize(inner)
    if parallel:
        sch.parallel(outer)
    return tvm.compile(sch.mod, target=target, tir_pipeline=tir_pipeline.pipeline(target) if relaxc else "default")


def run(lib, x: np.ndarray) -> np.ndarray:
    a = tvm.runtime.tensor(x, tvm.cpu())
    b = tvm.runtime.tensor(np.zeros_like(x), tvm.cpu())
    lib["main"](a, b)
    return b.numpy()


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Distance in units in the last place between float32 arrays of the same sign."""
    return np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))


def errors(name: str, got: np.ndarray, x: np.ndarray) -> dict:
    """What ``got`` = name(x) gets wrong, against numpy in float64."""
    with np.errstate(all="ignore"):
        exact = FUNCTIONS[name][1](x.astype(np.float64))
        want = exact.astype(np.float32)
    finite = np.isfinite(want)
    normal = finite & (np.abs(want) >= TINY)
    subnormal = finite & ~normal
    relative = np.abs(got[normal] - exact[normal]) / np.abs(exact[normal])
    return {
        "nan_exact": bool(np.array_equal(np.isnan(got), np.isnan(want))),
        "inf_exact": bool(np.array_equal(got[np.isinf(want)], want[np.isinf(want)])),
        "signs_exact": bool((np.sign(got[normal]) == np.sign(want[normal])).all()),
        "max_ulp": int(ulps(got[normal], want[normal]).max()),
        "max_relative": float(relative.max()),
        "max_absolute": float(np.abs(got[finite] - exact[finite]).max()),
        "subnormal_errors": np.abs(got[subnormal].astype(np.float64) - exact[subnormal]),
        "subnormal_exact": exact[subnormal],
    }


def speed_ns(fn: Callable, target: tvm.target.Target, lanes: int, relaxc: bool, n: int = 1 << 20,
             runs: int = 20) -> float:
    lib = kernel(fn, n, target, lanes, parallel=True, relaxc=relaxc)
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32) * 3
    a, b = tvm.runtime.tensor(x, tvm.cpu()), tvm.runtime.tensor(np.zeros_like(x), tvm.cpu())
    for _ in range(3):
        lib["main"](a, b)
    start = time.perf_counter()
    for _ in range(runs):
        lib["main"](a, b)
    return (time.perf_counter() - start) / runs / n * 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tvm", action="store_true", help="TVM's own lowering (speed only)")
    args = parser.parse_args(argv)
    if not args.tvm:
        from relaxc.passes.tir import fast_math

        fast_math.register()
    target = targets.resolve("cpu")
    lanes = targets.vector_lanes(target)
    x = inputs()
    print(f"# {platform.machine()}, target {target.attrs['mcpu']} ({lanes} lanes), 2 threads, "
          f"{'TVM lowering' if args.tvm else 'relaxc fast math'}\n")
    print("| function | max ulp (normal results) | max relative error | NaN/inf/sign exact | ns per element |")
    print("| --- | ---: | ---: | --- | ---: |")
    for name, (fn, _) in FUNCTIONS.items():
        e = errors(name, run(kernel(fn, N, target, lanes, relaxc=not args.tvm), x), x)
        exact = "yes" if e["nan_exact"] and e["inf_exact"] and e["signs_exact"] else "NO"
        ns = speed_ns(fn, target, lanes, not args.tvm)
        print(f"| {name} | {e['max_ulp']} | {e['max_relative']:.2g} | {exact} | {ns:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
