"""Tuning within its minutes (``schedules/tuning.py``): a batch starts only where it would end by the
deadline, a kernel whose search measures nothing new leaves the rounds, the progress knows the gain
over the defaults, and the selection begins no kernel after the deadline. The rounds run on a clock of
their own here, each batch taking the seconds it is given, so nothing depends on this machine's speed."""

from types import SimpleNamespace

import pytest

import relaxc
from relaxc.schedules import tuning
from tests import reference


class Clock:
    """``time.time`` and ``time.perf_counter`` of the tuning module, moved by the batches alone."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    perf_counter = time


@pytest.fixture
def rounds(monkeypatch):
    """``_tune_rounds`` over fake kernels: ``run(seconds, yields, left, deadline_in)`` where each kernel's
    batch takes ``seconds[name]`` and measures the next of ``yields[name]`` (1 us each)."""
    clock = Clock()
    monkeypatch.setattr(tuning, "time", clock)
    started: list[tuple[str, float]] = []

    def run(seconds: dict, yields: dict, left: int, deadline_in: float | None = None, defaults=None) -> dict:
        tasks = [SimpleNamespace(task_name=name, weight=1) for name in seconds]

        def batch(task, index, size, *_args):
            started.append((task.task_name, clock.now))
            clock.now += seconds[task.task_name]
            done = min(size, yields[task.task_name].pop(0))
            _args[-2].update(index, [1e-6] * done)  # progress
            return done

        monkeypatch.setattr(tuning, "_tune_batch", batch)
        deadline = None if deadline_in is None else clock.now + deadline_in
        return tuning._tune_rounds(tasks, {i: left for i in range(len(tasks))}, 2, 1000, deadline, "", None,
                                   (None, None), defaults)

    return run, clock, started


def test_a_kernel_whose_search_measures_nothing_new_leaves_the_rounds(rounds):
    run, _, started = rounds
    result = run({"a": 1, "b": 1}, {"a": [2, 0, 2], "b": [2, 2, 2]}, left=6)
    assert result["spent"] == ["a"] and result["trials"] == 8 and result["stopped"] == "done"
    assert [name for name, _ in started] == ["a", "b", "a", "b", "b"]  # a's empty batch was its last


def test_no_batch_starts_that_would_end_past_the_deadline(rounds):
    """a takes 10 s a batch, b 30: after a round (40 s) neither fits in the 5 s left of 45, so the run
    stops there, on time, instead of starting a 30 s batch at 40."""
    run, clock, started = rounds
    result = run({"a": 10, "b": 30}, {"a": [2] * 9, "b": [2] * 9}, left=18, deadline_in=45)
    assert result["stopped"] == "time budget" and result["trials"] == 4
    assert clock.now <= 1045 and [name for name, _ in started] == ["a", "b"]
    end = clock.now + 95  # 1135: the third round's a fits (1120 + 10), its b does not (1130 + 30)
    again = run({"a": 10, "b": 30}, {"a": [2] * 9, "b": [2] * 9}, left=18, deadline_in=95)
    assert again["trials"] == 10 and [n for n, _ in started[2:]] == ["a", "b", "a", "b", "a"] and clock.now <= end


def test_the_progress_knows_the_gain_over_the_defaults(rounds):
    run, _, _ = rounds
    result = run({"a": 1, "b": 1}, {"a": [2], "b": [2]}, left=2, defaults={0: 3.0, 1: 1.0})
    assert result["gain_estimate"] == pytest.approx(2.0)  # (3 + 1) us of defaults over (1 + 1) tuned


def test_the_selection_begins_no_kernel_after_the_deadline(tmp_path):
    """With no time left, nothing is selected and the summary says how many kernels wait for it (they
    replay their best record meanwhile); the next run without minutes selects them."""
    cache = str(tmp_path)
    relaxc.tune(reference.small_cnn(), trials=4, trials_per_task=2, cache_dir=cache, kernels=["*conv*"])
    late = relaxc.tune(reference.small_cnn(), trials=0, reselect=True, minutes=1e-6, cache_dir=cache)["selection"]
    assert late["selected"] == 0 and late["left_to_select"] > 0
    again = relaxc.tune(reference.small_cnn(), trials=0, reselect=True, cache_dir=cache)["selection"]
    assert again["selected"] == late["left_to_select"] and again["left_to_select"] == 0
