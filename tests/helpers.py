"""What several test modules share: running relaxc's command line as a user would (a fresh process
each time), a cache that makes dispatch choose a given candidate, a clock that stand-in work moves,
and a decoder's programs called directly."""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import tvm
import tvm_ffi

import relaxc
from relaxc.passes.tir import tir_pipeline
from relaxc.passes.dispatch import DIRECT, WINOGRAD
from relaxc.support.store_files import DISPATCH_FILE
from relaxc.schedules import cache
from relaxc.support import targets
from relaxc.support.cache_layout import CacheLayout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def host_runs_avx2() -> bool:
    """Whether this CPU runs code built for ``znver3`` (AVX2 and FMA), such as the committed logs'."""
    return targets.runs_on_host(targets.resolve({"kind": "llvm", "mcpu": "znver3"}))


def kernel_llvm_ir(func: tvm.tirx.PrimFunc, target) -> str:
    """The LLVM IR of one kernel, built as relaxc builds it (its TIR pipeline: TVM's default one
    expands each sigmoid's argument in place, which took a swish kernel 50 s and 3.5 MB of IR)."""
    mod = tvm.IRModule({"k": func.with_attr("global_symbol", "k")})
    return tvm.tirx.build(mod, target=target, pipeline=tir_pipeline.pipeline(target)).inspect_source("ll")


def env() -> dict:
    """This environment with the repository importable."""
    return {**os.environ, "PYTHONPATH": ROOT}


def relaxc_command(*args) -> list[str]:
    return [sys.executable, "-m", "relaxc", *(str(a) for a in args)]


def run_cli(*args, cwd=ROOT, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(relaxc_command(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env())


def store_choosing(tmp_path, model: onnx.ModelProto, choice: str) -> str:
    """A cache whose dispatch.json makes ``choice`` the fastest candidate of every workload."""
    art = relaxc.compile(model, tuning="off", dispatch="rule")
    workloads = {c["workload"] for c in art.report()["dispatch"]["convolutions"]}
    entry = {"candidates": {name: {"ms": 1.0 if name == choice else 2.0, "error": 0.0,
                                   "scratch_bytes": 0 if name == DIRECT else 1 << 20}
                            for name in [DIRECT, *WINOGRAD.values()]}}
    directory = tmp_path / cache.target_key(targets.resolve("cpu"))
    directory.mkdir(parents=True)
    (directory / DISPATCH_FILE).write_text(json.dumps({"workloads": {w: entry for w in workloads}}))
    return str(tmp_path)


class FakeClock:
    """A clock that moves only when stand-in work says so (``sleep``): times a test knows exactly,
    whatever the machine's speed or load. Patched over a module's ``time`` (``perf_counter``)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def call_program(art, function: str, past: int, sequence: int, write_at: int | None = None) -> list:
    """``function`` of ``art``'s program called directly with ``past`` tokens cached and ``sequence``
    more, as any caller could: no session checks its room (``decode`` writes the row at ``write_at``,
    default ``past``)."""
    runner, layout = art, CacheLayout.from_json(art.decoder["cache"])
    feeds = {"input_ids": np.zeros((1, sequence), np.int64), "attention_mask": np.ones((1, past + sequence), np.int64),
             "position_ids": np.arange(past, past + sequence, dtype=np.int64)[None]}
    feeds |= {name: runner.call_zeros(layout.shape(name, 1), layout.dtype) for name in layout.pasts}
    lengths = [tvm_ffi.Shape([past])] + ([np.array([past if write_at is None else write_at])] if function == "decode" else [])
    arguments = [feeds[name] for name, _, _ in runner.inputs] + lengths + runner.weight_argument()
    return runner.call(arguments, function)
