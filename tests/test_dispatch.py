"""Operator dispatch: Winograd F(2x2)/F(4x4) against onnxruntime, measure/replay/strict/rule/off
modes and the cache's dispatch.json, the strategies and the error limit, `relaxc inspect --dispatch`."""

import json

import numpy as np
import onnx
import pytest

import relaxc
from relaxc.build.report import dispatch_summary
from relaxc.passes import winograd
from relaxc.passes.dispatch import DIRECT, WINOGRAD
from relaxc.schedules import cache
from relaxc.schedules.dispatch import ERROR_LIMIT, Chooser, decide, forcing
from relaxc.support import targets
from relaxc.support.store_files import DISPATCH_FILE
from tests import reference
from tests.helpers import run_cli, store_choosing


@pytest.mark.parametrize("choice", [WINOGRAD[2], WINOGRAD[4]])
@pytest.mark.parametrize("shape", [
    dict(channels=16, out_channels=32, height=9, width=7, pads=1),  # tiles sticking out of the output
    dict(channels=24, out_channels=20, height=10, width=10, pads=0, batch=2),  # padded channel blocks, batch
    dict(channels=32, out_channels=32, height=8, width=8, pads=1, residual=True),  # residual add fused
])
def test_winograd_matches_onnxruntime(tmp_path, choice, shape):
    model = reference.conv3x3(**shape)
    art = relaxc.compile(model, tuning="off", cache_dir=store_choosing(tmp_path, model, choice))
    dispatch = art.report()["dispatch"]
    assert dispatch["choices"] == {choice: 1} and dispatch["sources"] == {"stored": 1}
    x = np.random.default_rng(1).standard_normal(
        (shape.get("batch", 1), shape["channels"], shape["height"], shape["width"])).astype(np.float32)
    want = reference.ort_run(model, {"x": x})
    assert want[0].std() > 0.1  # not a near-constant output
    reference.assert_matches(reference.relaxc_run(art, x), want)


def test_weight_transform_is_the_minimal_filtering_algorithm():
    """Y = A^T [(G g G^T) * (B^T d B)] A equals the 3x3 correlation of a tile, for both tile sizes."""
    rng = np.random.default_rng(0)
    for m in winograd.TILE_SIZES:
        at, g, bt = winograd.MATRICES[m]
        d = rng.standard_normal((m + 2, m + 2))
        k = rng.standard_normal((3, 3))
        direct = np.array([[np.sum(d[i:i + 3, j:j + 3] * k) for j in range(m)] for i in range(m)])
        np.testing.assert_allclose(at @ ((g @ k @ g.T) * (bt @ d @ bt.T)) @ at.T, direct, rtol=1e-12, atol=1e-12)


def test_measure_stores_then_replay_measures_nothing(tmp_path, monkeypatch):
    model = reference.conv3x3(16, 16, 12, 12, 1)
    first = relaxc.compile(model, tuning="off", dispatch="measure", cache_dir=str(tmp_path)).report()["dispatch"]
    assert first["sources"] == {"measured": 1}
    (conv,) = first["convolutions"]
    assert set(conv["candidates"]) == {DIRECT, *WINOGRAD.values()}
    assert all(c["ms"] > 0 and c["error"] <= ERROR_LIMIT for c in conv["candidates"].values())
    assert conv["candidates"][DIRECT]["error"] == 0 and conv["candidates"][WINOGRAD[4]]["scratch_bytes"] > 0
    assert conv["choice"] == decide({"candidates": conv["candidates"]}, "latency")
    stored = json.loads((tmp_path / cache.target_key(targets.resolve("cpu")) / DISPATCH_FILE).read_text())["workloads"]
    assert list(stored) == [conv["workload"]]
    monkeypatch.setattr(Chooser, "_measure", lambda *a: pytest.fail("measured again"))  # nothing built, nothing timed
    again = relaxc.compile(model, tuning="off", dispatch="replay", cache_dir=str(tmp_path))
    assert again.report()["dispatch"]["sources"] == {"stored": 1}


def test_replay_without_a_decision_uses_the_rule_and_strict_refuses(tmp_path):
    model = reference.conv3x3(16, 16, 8, 8, 1)
    report = relaxc.compile(model, tuning="off", cache_dir=str(tmp_path)).report()["dispatch"]
    assert report["sources"] == {"rule": 1} and report["choices"] == {WINOGRAD[4]: 1}
    with pytest.raises(relaxc.UserError, match="no dispatch decision for conv2d_nchwc.*dispatch='measure'"):
        relaxc.compile(model, tuning="strict", backends="relaxc", cache_dir=str(tmp_path))


def test_rule_keeps_direct_for_few_channels_f2_for_small_outputs_and_off_everywhere():
    narrow = relaxc.compile(reference.conv3x3(3, 16, 8, 8, 1), tuning="off", dispatch="rule").report()["dispatch"]
    assert narrow["choices"] == {DIRECT: 1}
    small = relaxc.compile(reference.conv3x3(16, 16, 7, 7, 1), tuning="off", dispatch="rule").report()["dispatch"]
    assert small["choices"] == {WINOGRAD[2]: 1}  # a 7x7 output: F(4x4) would cover 8x8 with 4x the weights
    lean = relaxc.compile(reference.conv3x3(16, 16, 8, 8, 1), tuning="off", strategy="memory").report()["dispatch"]
    assert lean["choices"] == {DIRECT: 1} and lean["sources"] == {"rule": 1}  # no transformed weights
    off = relaxc.compile(reference.conv3x3(16, 16, 8, 8, 1), tuning="off", dispatch="off").report()["dispatch"]
    assert off["choices"] == {DIRECT: 1} and off["sources"] == {"off": 1}


def test_decide_refuses_inaccurate_candidates_and_memory_strategy_takes_the_smallest():
    entry = {"candidates": {DIRECT: {"ms": 3.0, "error": 0.0, "scratch_bytes": 0},
                            WINOGRAD[2]: {"ms": 2.0, "error": ERROR_LIMIT / 2, "scratch_bytes": 100},
                            WINOGRAD[4]: {"ms": 1.0, "error": ERROR_LIMIT * 2, "scratch_bytes": 50}}}
    assert decide(entry, "latency") == WINOGRAD[2]
    assert decide(entry, "memory") == DIRECT


def test_a_choice_made_in_sequence_overrides_the_times_alone_under_latency_only():
    entry = {"candidates": {DIRECT: {"ms": 3.0, "error": 0.0, "scratch_bytes": 0},
                            WINOGRAD[2]: {"ms": 2.0, "error": 0.0, "scratch_bytes": 100},
                            WINOGRAD[4]: {"ms": 1.0, "error": ERROR_LIMIT * 2, "scratch_bytes": 50}}}
    assert decide({**entry, "in_sequence": {"choice": DIRECT}}, "latency") == DIRECT
    assert decide({**entry, "in_sequence": {"choice": DIRECT}}, "memory") == DIRECT
    assert decide({**entry, "in_sequence": {"choice": WINOGRAD[2]}}, "memory") == DIRECT
    assert decide({**entry, "in_sequence": {"choice": WINOGRAD[4]}}, "latency") == WINOGRAD[2]  # not accurate enough


def test_forcing_fixes_a_workloads_candidate_whatever_the_store_says(tmp_path):
    model = reference.conv3x3(16, 16, 8, 8, 1)
    store = store_choosing(tmp_path, model, WINOGRAD[4])
    (conv,) = relaxc.compile(model, tuning="off", cache_dir=store).report()["dispatch"]["convolutions"]
    assert conv["choice"] == WINOGRAD[4]
    with forcing({conv["workload"]: DIRECT}):
        forced = relaxc.compile(model, tuning="off", cache_dir=store).report()["dispatch"]
    assert forced["choices"] == {DIRECT: 1} and forced["sources"] == {"forced": 1}
    with forcing({conv["workload"]: "winograd7"}), pytest.raises(relaxc.UserError, match="not a candidate"):
        relaxc.compile(model, tuning="off", cache_dir=store)
    assert relaxc.compile(model, tuning="off", cache_dir=store).report()["dispatch"]["choices"] == {WINOGRAD[4]: 1}


def test_memory_strategy_compiles_direct_and_plans_less(tmp_path):
    model = reference.conv3x3(32, 32, 16, 16, 1)
    store = store_choosing(tmp_path, model, WINOGRAD[4])
    fast = relaxc.compile(model, tuning="off", cache_dir=store).report()
    small = relaxc.compile(model, tuning="off", cache_dir=store, strategy="memory").report()
    assert fast["dispatch"]["choices"] == {WINOGRAD[4]: 1} and small["dispatch"]["choices"] == {DIRECT: 1}
    assert small["memory"]["arena_bytes"] < fast["memory"]["arena_bytes"]


def test_the_summary_shows_the_times_in_sequence_that_decided(tmp_path):
    store = store_choosing(tmp_path, reference.conv3x3(16, 16, 8, 8, 1), WINOGRAD[4])
    path = next(tmp_path.glob(f"*/{DISPATCH_FILE}"))
    stored = json.loads(path.read_text())
    for entry in stored["workloads"].values():
        entry["in_sequence"] = {"model": "conv", "choice": DIRECT, "ms": {DIRECT: 1.5, WINOGRAD[4]: 1.75}}
    path.write_text(json.dumps(stored))
    dispatch = relaxc.compile(reference.conv3x3(16, 16, 8, 8, 1), tuning="off", cache_dir=store).report()["dispatch"]
    assert dispatch["choices"] == {DIRECT: 1}
    assert "in sequence (conv, chose direct): direct 1.500 ms  winograd4 1.750 ms" in dispatch_summary(dispatch)


def test_inspect_prints_the_choices(tmp_path):
    path = tmp_path / "conv.onnx"
    onnx.save(reference.conv3x3(16, 16, 8, 8, 1), str(path))
    out = run_cli("inspect", str(path), "--tuning", "off", "--dispatch-mode", "rule", "--dispatch")
    assert out.returncode == 0, out.stderr
    block = targets.vector_lanes(targets.resolve("cpu"))  # 16 with AVX-512, 8 with AVX2
    assert "dispatch: 1 winograd4 (1 rule)" in out.stdout and f"conv2d_nchwc-1x{16 // block}x8x8x{block}" in out.stdout

