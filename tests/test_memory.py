"""The arena storage planner: placements on synthetic lifetimes (property-based), optimality on small
cases, and the plans of real models (bounds, garbage-filled arena, unshared kernels, TVM's planner)."""

import itertools
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import relaxc
from relaxc.passes import memory
from relaxc.passes.memory import ALIGNMENT, Tensor, lower_bound, plan, verify_placement
from tests import reference


def _painted_overlaps(tensors: list[Tensor], offsets: dict[str, int]) -> int:
    """Independent check: paint every tensor's bytes (in alignment units) at every binding it is
    live, and count cells painted twice."""
    steps = max(t.last for t in tensors) + 1
    height = max(offsets[t.name] + t.size for t in tensors) // ALIGNMENT
    grid = np.zeros((steps, height), dtype=np.int32)
    for t in tensors:
        start = offsets[t.name] // ALIGNMENT
        grid[t.first:t.last + 1, start:start + t.size // ALIGNMENT] += 1
    return int((grid > 1).sum())


def _tensors(draw_sizes, draw_spans) -> list[Tensor]:
    return [Tensor(f"t{i}", size * ALIGNMENT, first, first + length)
            for i, (size, (first, length)) in enumerate(zip(draw_sizes, draw_spans))]


def lifetime_sets(most: int, largest: int, latest: int, longest: int):
    """Up to ``most`` tensors of 1..``largest`` alignment units, starting by ``latest``, living up to
    ``longest`` more bindings."""
    return st.integers(1, most).flatmap(lambda n: st.builds(
        _tensors,
        st.lists(st.integers(1, largest), min_size=n, max_size=n),
        st.lists(st.tuples(st.integers(0, latest), st.integers(0, longest)), min_size=n, max_size=n)))


lifetimes = lifetime_sets(most=40, largest=64, latest=30, longest=12)


@settings(max_examples=200, deadline=None)
@given(lifetimes)
def test_no_two_live_tensors_share_a_byte(tensors):
    offsets, arena = plan(tensors)
    assert _painted_overlaps(tensors, offsets) == 0
    assert verify_placement(tensors, offsets, arena) == []
    assert all(offsets[t.name] % ALIGNMENT == 0 and offsets[t.name] + t.size <= arena for t in tensors)
    assert arena >= lower_bound(tensors)


def _optimum(tensors: list[Tensor]) -> int:
    """Brute force, written apart from the planner: every order, each tensor at the lowest offset
    clear of the tensors already placed that it overlaps in time (an optimal placement replayed in
    order of its offsets is one of these)."""
    best = None
    for order in itertools.permutations(tensors):
        placed = []
        for t in order:
            offset = 0
            while any(t.first <= u.last and u.first <= t.last and offset < o + u.size and o < offset + t.size
                      for o, u in placed):
                offset += ALIGNMENT
            placed.append((offset, t))
        top = max(o + u.size for o, u in placed)
        best = top if best is None else min(best, top)
    return best


small_lifetimes = lifetime_sets(most=5, largest=6, latest=6, longest=4)


@settings(max_examples=150, deadline=None)
@given(small_lifetimes)
def test_small_cases_are_placed_optimally(tensors):
    assert plan(tensors)[1] == _optimum(tensors)


def test_lower_bound_and_plan_on_a_known_case():
    # a and c never overlap in time and b overlaps both: 3 units of b plus the larger of a, c
    tensors = [Tensor("a", 2 * ALIGNMENT, 0, 1), Tensor("b", 3 * ALIGNMENT, 1, 3), Tensor("c", 4 * ALIGNMENT, 2, 4)]
    assert lower_bound(tensors) == 7 * ALIGNMENT
    offsets, arena = plan(tensors)
    assert arena == 7 * ALIGNMENT
    assert verify_placement(tensors, offsets, arena) == []


def test_greedy_beats_block_reuse_on_many_tensors():
    rng = np.random.default_rng(3)
    tensors = [Tensor(f"t{i}", int(rng.integers(1, 100)) * ALIGNMENT, i, i + int(rng.integers(1, 6)))
               for i in range(60)]
    offsets, arena = plan(tensors)
    assert _painted_overlaps(tensors, offsets) == 0
    assert arena <= 1.1 * lower_bound(tensors)


def test_verify_placement_names_the_clash():
    tensors = [Tensor("a", ALIGNMENT, 0, 2), Tensor("b", ALIGNMENT, 2, 3)]
    problems = verify_placement(tensors, {"a": 0, "b": 0}, ALIGNMENT)
    assert len(problems) == 1 and "a [0, 64) and b [0, 64)" in problems[0]
    assert verify_placement(tensors, {"a": 0, "b": 32}, 2 * ALIGNMENT)[0].startswith("b at [32, 96) is misaligned")


# --- real models ----------------------------------------------------------------------------------

def _memory(art) -> dict:
    return art.report()["memory"]


def test_small_cnn_plan_is_real_and_correct():
    art = relaxc.compile(reference.small_cnn(), validate_memory=True)
    report = _memory(art)
    assert report["planner"] == "arena" and report["validated"]
    assert report["lower_bound_bytes"] <= report["arena_bytes"] <= report["tvm_static_plan_bytes"]
    assert report["arena_bytes"] < report["no_reuse_bytes"]
    assert report["padding_bytes"] == art.report()["layout"]["padding_bytes"] > 0  # 20 channels padded to 24
    assert 0 < report["alignment_bytes"] < ALIGNMENT * len(report["tensors"])
    assert all(t["bytes"] % ALIGNMENT == 0 and t["offset"] % ALIGNMENT == 0 for t in report["tensors"])
    outputs = set(report["outputs"])
    assert outputs and not outputs & {t["name"] for t in report["tensors"]}  # outputs stay outside
    # the built program allocates the planned arena once
    final = art.ir("final")
    assert len(re.findall(rf"arena: R.Any = R.vm.alloc_storage\(R.shape\(\[{report['arena_bytes']}\]\)", final)) == 1
    inputs = reference.random_inputs(art.inputs)
    expected = reference.ort_run(reference.small_cnn(), inputs)
    for _ in range(2):  # the second run starts from the garbage the first left behind
        reference.assert_matches(reference.relaxc_run(art, inputs), expected)


def test_garbage_fill_exposes_a_broken_plan(monkeypatch):
    """With every tensor at offset 0 (and the check switched off), garbage and clobbered inputs
    reach the outputs; with the check on, compile refuses the plan."""
    def everything_at_zero(tensors):
        return {t.name: 0 for t in tensors}, max(t.size for t in tensors)

    monkeypatch.setattr(memory, "plan", everything_at_zero)
    with pytest.raises(RuntimeError, match="memory plan of main is invalid: .* share bytes"):
        relaxc.compile(reference.small_cnn())
    monkeypatch.setattr(memory, "verify_placement", lambda *args: [])
    art = relaxc.compile(reference.small_cnn(), validate_memory=True)
    inputs = reference.random_inputs(art.inputs)
    with pytest.raises(AssertionError):
        reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(reference.small_cnn(), inputs))


def test_unshared_kernels_get_bytes_of_their_own():
    shared = _memory(relaxc.compile(reference.branchy_cnn()))
    art = relaxc.compile(reference.branchy_cnn(), unshared=["fused_conv2d*"], validate_memory=True)
    report = _memory(art)
    own = [t for t in report["tensors"] if t["kernel"].startswith("fused_conv2d")]
    others = [t for t in report["tensors"] if t not in own]
    assert own and report["unshared"] == ["fused_conv2d*"]
    for t in own:
        for u in report["tensors"]:
            if u is not t:
                assert t["offset"] + t["bytes"] <= u["offset"] or u["offset"] + u["bytes"] <= t["offset"], (t, u)
    assert others and report["arena_bytes"] > shared["arena_bytes"]
    inputs = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(reference.branchy_cnn(), inputs))


def test_tvm_planner_for_comparison():
    art = relaxc.compile(reference.branchy_cnn(), memory_planner="tvm")
    report = _memory(art)
    assert report["planner"] == "tvm" and report["arena_bytes"] == report["tvm_static_plan_bytes"]
    assert "arena" not in art.ir("final")
    inputs = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(reference.branchy_cnn(), inputs))
    with pytest.raises(relaxc.UserError, match="memory_planner must be one of arena, tvm"):
        relaxc.compile(reference.small_cnn(), memory_planner="best")
