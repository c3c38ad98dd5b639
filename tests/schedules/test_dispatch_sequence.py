"""Dispatch decided in the model's sequence (schedules/dispatch_sequence.py): which calls are a
candidate's own, how they are timed, the tie rule and what is stored; the whole flow through
``compiler.tune`` is in tests/test_tuning.py."""

import json

import pytest
from tvm import te

from relaxc.passes.dispatch import DIRECT, WINOGRAD
from relaxc.schedules import dispatch_sequence, sequence
from relaxc.schedules.cache import RecordStore
from relaxc.schedules.dispatch import DispatchStore
from relaxc.schedules.dispatch_sequence import Variant, contested, decide_in_sequence, own_calls, time_variants
from relaxc.schedules.selection import TOLERANCE
from relaxc.support import targets
from tests.helpers import FakeClock


def _kernel(symbol: str, scale: float):
    a = te.placeholder((4,), name="a")
    return te.create_prim_func([a, te.compute((4,), lambda i: a[i] * scale, name="b")]).with_attr("global_symbol", symbol)


def _variant(own_symbol: str, own_seconds: float, shared_symbol: str, clock: FakeClock | None = None) -> Variant:
    """A shared kernel (named differently per variant, as fusion numbers them), one of its own
    called twice, and a builtin; each call moves ``clock`` by its seconds."""
    clock = clock or FakeClock()

    def taking(seconds: float):
        return lambda *_: clock.sleep(seconds)

    calls = [("vm.builtin.alloc_tensor", taking(0.004), []), (shared_symbol, taking(0.003), []),
             (own_symbol, taking(own_seconds), []), (own_symbol, taking(own_seconds), [])]
    kernels = {shared_symbol: _kernel(shared_symbol, 2.0), own_symbol: _kernel(own_symbol, 3.0 + own_seconds)}
    return Variant(calls, kernels)


def test_own_calls_are_those_of_kernels_not_in_every_build_whatever_their_names():
    variants = {"a": _variant("conv", 0.001, "shared1"), "b": _variant("winograd", 0.002, "shared2")}
    assert own_calls(variants) == {"a": [2, 3], "b": [2, 3]}


def test_a_variant_costs_the_medians_of_its_own_calls_only(monkeypatch):
    """Timed on a fake clock the calls move: exact times, whatever the machine's load."""
    clock = FakeClock()
    monkeypatch.setattr(sequence, "time", clock)  # time_in_order's clock
    variants = {"fast": _variant("conv", 0.001, "shared1", clock), "slow": _variant("winograd", 0.003, "shared2", clock)}
    ms = time_variants(variants, runs=5)
    assert ms == pytest.approx({"fast": 2.0, "slow": 6.0})  # two calls each; shared ones and builtins left out


def test_decisions_keep_the_current_choice_within_the_tolerance_and_are_stored(tmp_path, monkeypatch):
    monkeypatch.setattr(dispatch_sequence, "time_variants", lambda variants, runs: {
        name: {"direct": 1.0, WINOGRAD[2]: 1.0 * (1 + TOLERANCE / 2), WINOGRAD[4]: 3.0}[name] for name in variants})
    store = DispatchStore(RecordStore.of(str(tmp_path), targets.resolve("cpu")))
    measured = {"candidates": {name: {"ms": 1.0, "error": 0.0, "scratch_bytes": 0}
                               for name in (DIRECT, *WINOGRAD.values())}}
    store.save("kept", measured)
    store.save("changed", measured)
    built = []

    def build(workload: str, candidate: str) -> Variant:
        built.append((workload, candidate))
        return Variant([], {})

    workloads = {"kept": (WINOGRAD[2], [DIRECT, WINOGRAD[2]]), "changed": (WINOGRAD[4], [DIRECT, WINOGRAD[4]])}
    summary = decide_in_sequence(workloads, build, store, "model", runs=1)
    assert built == [("kept", DIRECT), ("kept", WINOGRAD[2]), ("changed", DIRECT), ("changed", WINOGRAD[4])]
    assert summary["changed"] == ["changed"] and summary["decisions"]["kept"]["choice"] == WINOGRAD[2]
    stored = json.loads(open(store.path).read())["workloads"]
    assert stored["changed"]["in_sequence"]["choice"] == DIRECT and stored["changed"]["in_sequence"]["model"] == "model"
    assert stored["changed"]["candidates"] == measured["candidates"]  # the measurement alone is kept beside it


def test_contested_workloads_have_several_accurate_measured_candidates():
    convolutions = [
        {"workload": "both", "choice": DIRECT, "candidates": {DIRECT: {"error": 0.0}, WINOGRAD[4]: {"error": 0.0}}},
        {"workload": "one accurate", "choice": DIRECT, "candidates": {DIRECT: {"error": 0.0}, WINOGRAD[4]: {"error": 1.0}}},
        {"workload": "ruled", "choice": WINOGRAD[4]},
    ]
    assert contested(convolutions) == {"both": (DIRECT, [DIRECT, WINOGRAD[4]])}
