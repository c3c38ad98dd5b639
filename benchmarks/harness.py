"""Latency of relaxc against onnxruntime, measured in the same run (``python -m relaxc.benchmarks.bench``).

Both get the same thread count (2 by default) and the same random inputs; outputs are checked
against onnxruntime with the project tolerance before anything is timed. Latency is the median of
``repeat`` runs. The runtimes take turns in blocks (each block after a pause and a warm-up run), so
a slow spell of the machine hits both, while neither runs while the other's thread pool is still
spinning: single runs in alternation measured that contention (SqueezeNet: 21 ms instead of 11),
and so did blocks without the pause for models of a few milliseconds (onnxruntime's workers spin
for tens of milliseconds after their last task: a 768x768 dense layer measured 4.2 ms after
onnxruntime's block, 1.6 ms after the pause). Prints a Markdown table (``relaxc-bench --markdown``
writes it into ``docs/results.md``) that says which runtime ran each model: a model that TVM's
importer refused runs whole on onnxruntime, and its row gives no ratio (it would time onnxruntime
against itself); the geometric mean is over the rows relaxc ran.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np
import onnx

from relaxc.benchmarks import reference
from relaxc.support.turns import alternate
from relaxc.frontend import models
from relaxc.build.report import runs_on
from relaxc.runtime.runner import random_inputs
from relaxc.support import targets


@dataclass
class Row:
    model: str
    compile_s: float
    relaxc_ms: float
    ort_ms: float
    runs_on: str = "relaxc"  # which runtime ran the artifact (``report.runs_on``)
    artifact: Any = field(default=None, repr=False)  # what was timed, to profile it after

    @property
    def relaxc_ran(self) -> bool:
        """Whether relaxc's kernels ran the model (all of it, or beside an external subgraph)."""
        return self.runs_on.startswith("relaxc")

    @property
    def ratio(self) -> float | None:
        """relaxc's time over onnxruntime's; None where onnxruntime ran the whole model."""
        return self.relaxc_ms / self.ort_ms if self.relaxc_ran else None


def _load(spec: str) -> onnx.ModelProto:
    from relaxc import frontend

    return frontend.load_model(spec)[0]


def bench_one(spec: str, *, repeat: int, threads: int, target: str, **compile_options) -> Row:
    """Compile ``spec``, check it against onnxruntime, and time both in alternating rounds."""
    import relaxc

    start = time.perf_counter()
    art = relaxc.compile(spec, target=target, **compile_options)
    compile_s = time.perf_counter() - start
    inputs = random_inputs(art.inputs, high=art.input_high)
    session = reference.ort_session(_load(spec), threads=threads)
    reference.assert_matches(art.run(inputs), session.run(None, inputs))
    ms = alternate({"relaxc": lambda: art.run(inputs), "onnxruntime": lambda: session.run(None, inputs)},
                   repeat)
    return Row(spec, compile_s, ms["relaxc"], ms["onnxruntime"], runs_on(art.report()["backends"]), art)


def header(threads: int, repeat: int, target: str) -> str:
    return (f"# {platform.machine()}, target {target} (mcpu {targets.host_cpu()}), {threads} threads for "
            f"both, onnxruntime {reference.onnxruntime().__version__}, median of {repeat}\n\n"
            "| model | compile (s) | relaxc (ms) | onnxruntime (ms) | ratio |\n"
            "| --- | ---: | ---: | ---: | ---: |")


def ratio_cell(row: Row) -> str:
    """The ratio, naming the other runtime where one ran part of the model; none, naming it, where
    it ran the whole model."""
    if row.ratio is None:
        return f"none: {row.runs_on}"
    return f"{row.ratio:.2f}x" + ("" if row.runs_on == "relaxc" else f" ({row.runs_on})")


def format_row(row: Row) -> str:
    return f"| {row.model} | {row.compile_s:.1f} | {row.relaxc_ms:.1f} | {row.ort_ms:.1f} | {ratio_cell(row)} |"


def geomean_line(rows: Sequence[Row]) -> str:
    """The geometric mean ratio over the rows relaxc ran, naming the rows left out."""
    ratios = [r.ratio for r in rows if r.ratio is not None]
    others = [r.model for r in rows if r.ratio is None]
    line = (f"geometric mean ratio {float(np.exp(np.mean(np.log(ratios)))):.2f}x over {len(ratios)} models"
            if ratios else "no model ran on relaxc's kernels")
    return line + (f"; left out, not run by relaxc: {', '.join(others)}" if others else "")


def run(specs: Sequence[str] | None, *, repeat: int = 20, threads: int = 2, target: str = "cpu",
        print_fn: Callable[[str], None] = print, **compile_options) -> list[Row]:
    """Benchmark ``specs`` (default: every bundled model), printing the table as rows finish."""
    os.environ["TVM_NUM_THREADS"] = str(threads)  # read when TVM's thread pool starts
    specs = list(specs or [f"onnx:{name}" for name in models.BUNDLED])
    print_fn(header(threads, repeat, target))
    rows = []
    for spec in specs:
        row = bench_one(spec, repeat=repeat, threads=threads, target=target, **compile_options)
        rows.append(replace(row, artifact=None))  # one compiled model at a time held in memory
        print_fn(format_row(rows[-1]))
    print_fn(f"\n{geomean_line(rows)}")
    return rows
