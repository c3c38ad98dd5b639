"""relaxc's parallel launcher (compiler/runtime/launcher.c) in place of TVM's pool: every iteration of
a parallel loop run once, errors raised in any task reach the caller, concurrent callers, a forked
child, and the loader's choice in exported models."""

from __future__ import annotations

import gc
import multiprocessing
import os
import shutil
import threading

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

import relaxc
from relaxc.runtime import launcher
from relaxc.runtime.runner import random_inputs
from tests import reference

KERNEL = '''
@T.prim_func
def main(a: T.Buffer(({n},), "float32"), b: T.Buffer(({n},), "float32")):
    T.func_attr({{"global_symbol": "main", "tirx.noalias": True}})
    for i in T.parallel({n}):
        assert a[i] < T.float32(1000.0), ("ValueError", ["an element is 1000 or more"])
        b[i] = b[i] + a[i] * T.float32(2.0) + T.float32(1.0)
'''


def _kernel(folder, n: int, threads: int = 3):
    """A parallel loop over n elements (each one's output added to, so a twice-run iteration shows),
    exported with the launcher and loaded with it in place."""
    func = tvm.script.from_source(KERNEL.format(n=n), extra_vars={"T": T})
    path = os.path.join(folder, f"parallel{n}.so")
    tvm.compile(func, target="llvm").export_library(path, addons=[launcher.compile_object(str(folder))])
    module = tvm.runtime.load_module(path)
    assert launcher.install(path, threads) == "relaxc"
    return module["main"]


def _run(main, a: np.ndarray) -> np.ndarray:
    out = tvm.runtime.tensor(np.zeros_like(a))
    main(tvm.runtime.tensor(a), out)
    return out.numpy()


@pytest.mark.parametrize("n", [3, 7, 1001])  # fewer iterations than tasks, and a remainder
def test_each_iteration_runs_once(tmp_path, n):
    main = _kernel(tmp_path, n)
    a = np.arange(n, dtype="float32") / 10
    for _ in range(50):
        np.testing.assert_array_equal(_run(main, a), a * 2 + 1)


def test_an_error_in_any_task_reaches_the_caller(tmp_path):
    main = _kernel(tmp_path, 1001)
    bad = np.full(1001, 5000, "float32")  # every task fails, on whichever thread claims it
    for _ in range(100):
        with pytest.raises(ValueError, match="an element is 1000 or more"):
            _run(main, bad)
    a = np.ones(1001, "float32")
    np.testing.assert_array_equal(_run(main, a), a * 2 + 1)  # and the pool still works


def test_concurrent_callers_each_get_their_whole_loop(tmp_path):
    main = _kernel(tmp_path, 4099)
    wrong: list[int] = []

    def call(seed: int) -> None:
        a = np.random.default_rng(seed).random(4099, dtype="float32")
        for _ in range(100):
            if not np.array_equal(_run(main, a), a * 2 + 1):
                wrong.append(seed)

    callers = [threading.Thread(target=call, args=(seed,)) for seed in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert not wrong


def test_a_forked_child_runs_the_kernel(tmp_path):
    main = _kernel(tmp_path, 1001)
    a = np.arange(1001, dtype="float32") / 10
    _run(main, a)  # the parent's workers have run
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=lambda: queue.put(bool(np.array_equal(_run(main, a), a * 2 + 1))))
    child.start()  # the child's copy of the pool has no workers: it starts its own
    child.join(60)
    assert child.exitcode == 0 and queue.get(timeout=1)


def test_exported_models_load_with_the_launcher_chosen(tmp_path):
    art = relaxc.compile(reference.small_cnn())
    art.export(tmp_path / "model.so")
    shutil.copy(tmp_path / "model.so", tmp_path / "even.so")  # TVM's load resets the pointer of a path
    shutil.copy(tmp_path / "model.json", tmp_path / "even.json")
    claimed, even = relaxc.load(tmp_path / "model.so"), relaxc.load(tmp_path / "even.so", parallel="tvm")
    assert (claimed.launcher, even.launcher) == ("relaxc", "tvm")
    inputs = random_inputs(art.inputs)
    expected = art.run(inputs)
    for deployed in (claimed, even):
        assert all(np.array_equal(a, b) for a, b in zip(deployed.run(inputs), expected))


def test_a_library_without_the_launcher_keeps_tvms_pool(tmp_path):
    func = tvm.script.from_source(KERNEL.format(n=64), extra_vars={"T": T})
    path = str(tmp_path / "plain.so")
    tvm.compile(func, target="llvm").export_library(path)
    tvm.runtime.load_module(path)
    assert launcher.install(path, 2) == "tvm (exported without relaxc's launcher)"


def test_a_library_exported_again_under_its_path_loads_anew(tmp_path):
    """Once its last load is gone, the launcher's threads stop. TVM never unloads a library, so a
    model exported again under the same path is loaded from a copy: the new model runs, not the
    one still mapped from that path."""
    first, second = relaxc.compile(reference.small_cnn(seed=0)), relaxc.compile(reference.small_cnn(seed=1))
    inputs = random_inputs(first.inputs)
    expected = first.run(inputs), second.run(inputs)  # TVM's pool (these run in memory) has started
    first.export(tmp_path / "model.so")
    threads = len(os.listdir("/proc/self/task"))
    deployed = relaxc.load(tmp_path / "model.so")
    assert deployed.launcher == "relaxc" and len(os.listdir("/proc/self/task")) > threads  # its worker
    assert all(np.array_equal(a, b) for a, b in zip(deployed.run(inputs), expected[0]))
    del deployed
    gc.collect()
    assert len(os.listdir("/proc/self/task")) == threads  # joined
    second.export(tmp_path / "model.so")
    again = relaxc.load(tmp_path / "model.so")
    assert all(np.array_equal(a, b) for a, b in zip(again.run(inputs), expected[1]))
