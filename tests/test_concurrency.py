"""run() from many threads and processes at once gives what one thread alone gives."""

import multiprocessing
import threading

import numpy as np
import onnx
import pytest

import relaxc
from relaxc.frontend import models
from relaxc.runtime.runner import random_inputs
from tests import reference

THREADS, RUNS = 8, 50


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    # random weights: the light model's constant weights give the same output for every input
    art = relaxc.compile(reference.randomize_weights(onnx.load(models.bundled_path("onnx:squeezenet"))))
    library = tmp_path_factory.mktemp("concurrency") / "squeezenet.so"
    art.export(library)
    return art, str(library)


def _hammer(runner, inputs, expected) -> list[str]:
    problems: list[str] = []
    barrier = threading.Barrier(THREADS)

    def work(seed: int) -> None:
        barrier.wait()
        for i in range(RUNS):
            try:
                out = runner.run(inputs[(seed + i) % len(inputs)])[0]
            except Exception as err:  # noqa: BLE001 - collected and asserted on below
                problems.append(f"thread {seed}: {err!r}")
                return
            if not np.array_equal(out, expected[(seed + i) % len(inputs)]):
                problems.append(f"thread {seed} run {i}: output differs")

    pool = [threading.Thread(target=work, args=(seed,)) for seed in range(THREADS)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return problems


@pytest.mark.parametrize("form", ["compiled", "loaded"])
def test_threads_get_the_single_threaded_outputs(compiled, form):
    art, library = compiled
    runner = art if form == "compiled" else relaxc.load(library)
    inputs = [random_inputs(runner.inputs, seed) for seed in range(3)]  # distinct inputs catch shared arenas
    expected = [runner.run(x)[0] for x in inputs]
    assert not np.array_equal(expected[0], expected[1])
    assert _hammer(runner, inputs, expected) == []
    assert 1 < runner._pool.created <= runner._pool.limit


def test_concurrency_limit_bounds_the_vms(compiled):
    runner = relaxc.load(compiled[1], concurrency=2)
    inputs = [random_inputs(runner.inputs, seed) for seed in range(2)]
    assert _hammer(runner, inputs, [runner.run(x)[0] for x in inputs]) == []
    assert runner._pool.created == 2
    with pytest.raises(relaxc.UserError, match="at least 1"):
        relaxc.load(compiled[1], concurrency=0)


def test_threads_running_a_dynamic_artifact_at_different_sizes(tmp_path):
    """One artifact of a dynamic batch, each thread's calls at their own sizes, loaded from disk."""
    model = reference.small_cnn()
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    library = tmp_path / "dynamic.so"
    relaxc.compile(model, tuning="off", dim_bounds={"batch": 8}).export(library)
    runner = relaxc.load(str(library))
    inputs = [random_inputs(runner.inputs, seed, dims={"batch": batch}) for seed, batch in enumerate((1, 5, 8))]
    expected = [runner.run(x)[0] for x in inputs]
    assert [e.shape[0] for e in expected] == [1, 5, 8]
    assert _hammer(runner, inputs, expected) == []


def _run_in_child(runner, inputs, queue) -> None:
    queue.put(runner.run(inputs)[0])


def _load_and_run_in_child(library, inputs, queue) -> None:
    queue.put(relaxc.load(library).run(inputs)[0])


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_child_processes_run_what_the_parent_compiled(compiled, start):
    art, library = compiled
    inputs = random_inputs(art.inputs, 7)
    expected = art.run(inputs)[0]  # the parent's thread pool is running when it forks
    context = multiprocessing.get_context(start)
    queue = context.Queue()
    if start == "fork":  # the compiled artifact itself, inherited
        child = context.Process(target=_run_in_child, args=(art, inputs, queue))
    else:  # a fresh interpreter loads the exported library
        child = context.Process(target=_load_and_run_in_child, args=(library, inputs, queue))
    child.start()
    out = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    np.testing.assert_array_equal(out, expected)
