"""Operator dispatch: Winograd F(2x2)/F(4x4) against onnxruntime, measure/replay/strict/heuristic/off
modes and the record store's dispatch.json, the strategies and the error limit, `relaxc inspect --dispatch`."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import compiler
from passes import winograd
from passes.dispatch import DIRECT, WINOGRAD
from schedules import cache
from schedules.dispatch import ERROR_LIMIT, FILE, decide
from support import targets
from tests import reference
from tests.helpers import relaxc


def _conv(channels: int, out_channels: int, height: int, width: int, pads: int, batch: int = 1,
          residual: bool = False, seed: int = 0) -> onnx.ModelProto:
    """Conv 3x3 stride 1 + bias + ReLU (and a residual add of the input when the shapes allow)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((out_channels, channels, 3, 3)) / np.sqrt(9 * channels)).astype(np.float32)
    b = rng.standard_normal(out_channels).astype(np.float32)
    out_h, out_w = height + 2 * pads - 2, width + 2 * pads - 2
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pads] * 4)]
    if residual:
        nodes.append(helper.make_node("Add", ["c", "x"], ["s"]))
    nodes.append(helper.make_node("Relu", ["s" if residual else "c"], ["y"]))
    return reference._model(
        nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, channels, height, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, out_channels, out_h, out_w])],
        [reference._const("w", w), reference._const("b", b)])


def _onnxruntime(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _store_choosing(tmp_path, model: onnx.ModelProto, choice: str) -> str:
    """A record store whose dispatch.json makes ``choice`` the fastest candidate of every workload."""
    art = compiler.compile(model, tuning="off", dispatch="heuristic")
    workloads = {c["workload"] for c in art.report()["dispatch"]["convolutions"]}
    entry = {"candidates": {name: {"ms": 1.0 if name == choice else 2.0, "error": 0.0,
                                   "scratch_bytes": 0 if name == DIRECT else 1 << 20}
                            for name in [DIRECT, *WINOGRAD.values()]}}
    directory = tmp_path / cache.target_key(targets.resolve("cpu"))
    directory.mkdir(parents=True)
    (directory / FILE).write_text(json.dumps({"workloads": {w: entry for w in workloads}}))
    return str(tmp_path)


@pytest.mark.parametrize("choice", [WINOGRAD[2], WINOGRAD[4]])
@pytest.mark.parametrize("shape", [
    dict(channels=16, out_channels=32, height=9, width=7, pads=1),  # tiles sticking out of the output
    dict(channels=24, out_channels=20, height=10, width=10, pads=0, batch=2),  # padded channel blocks, batch
    dict(channels=32, out_channels=32, height=8, width=8, pads=1, residual=True),  # residual add fused
])
def test_winograd_matches_onnxruntime(tmp_path, choice, shape):
    model = _conv(**shape)
    art = compiler.compile(model, tuning="off", cache_dir=_store_choosing(tmp_path, model, choice))
    dispatch = art.report()["dispatch"]
    assert dispatch["choices"] == {choice: 1} and dispatch["sources"] == {"stored": 1}
    x = np.random.default_rng(1).standard_normal(
        (shape.get("batch", 1), shape["channels"], shape["height"], shape["width"])).astype(np.float32)
    want = _onnxruntime(model, x)
    assert want.std() > 0.1  # not a near-constant output
    np.testing.assert_allclose(art.run(x)[0], want, rtol=1e-4, atol=1e-4)


def test_weight_transform_is_the_minimal_filtering_algorithm():
    """Y = A^T [(G g G^T) * (B^T d B)] A equals the 3x3 correlation of a tile, for both tile sizes."""
    rng = np.random.default_rng(0)
    for m in winograd.TILE_SIZES:
        at, g, bt = winograd.MATRICES[m]
        d = rng.standard_normal((m + 2, m + 2))
        k = rng.standard_normal((3, 3))
        direct = np.array([[np.sum(d[i:i + 3, j:j + 3] * k) for j in range(m)] for i in range(m)])
        np.testing.assert_allclose(at @ ((g @ k @ g.T) * (bt @ d @ bt.T)) @ at.T, direct, rtol=1e-12, atol=1e-12)


def test_measure_stores_then_replay_measures_nothing(tmp_path):
    model = _conv(16, 16, 12, 12, 1)
    first = compiler.compile(model, tuning="off", dispatch="measure", cache_dir=str(tmp_path)).report()["dispatch"]
    assert first["sources"] == {"measured": 1}
    (conv,) = first["convolutions"]
    assert set(conv["candidates"]) == {DIRECT, *WINOGRAD.values()}
    assert all(c["ms"] > 0 and c["error"] <= ERROR_LIMIT for c in conv["candidates"].values())
    assert conv["candidates"][DIRECT]["error"] == 0 and conv["candidates"][WINOGRAD[4]]["scratch_bytes"] > 0
    assert conv["choice"] == decide({"candidates": conv["candidates"]}, "latency")
    stored = json.loads((tmp_path / cache.target_key(targets.resolve("cpu")) / FILE).read_text())["workloads"]
    assert list(stored) == [conv["workload"]]
    again = compiler.compile(model, tuning="off", dispatch="replay", cache_dir=str(tmp_path))
    assert again.report()["dispatch"]["sources"] == {"stored": 1}
    seconds = {p["name"]: p["seconds"] for p in again.report()["phases"]}
    assert seconds["dispatch"] < 1.0  # nothing built, nothing timed (measuring took seconds)


def test_replay_without_a_decision_uses_the_rule_and_strict_refuses(tmp_path):
    model = _conv(16, 16, 8, 8, 1)
    report = compiler.compile(model, tuning="off", cache_dir=str(tmp_path)).report()["dispatch"]
    assert report["sources"] == {"rule": 1} and report["choices"] == {WINOGRAD[4]: 1}
    with pytest.raises(compiler.UserError, match="no dispatch decision for conv2d_nchwc.*dispatch='measure'"):
        compiler.compile(model, tuning="strict", cache_dir=str(tmp_path))


def test_rule_keeps_direct_for_few_input_channels_and_off_everywhere():
    narrow = compiler.compile(_conv(3, 16, 8, 8, 1), tuning="off", dispatch="heuristic").report()["dispatch"]
    assert narrow["choices"] == {DIRECT: 1}
    off = compiler.compile(_conv(16, 16, 8, 8, 1), tuning="off", dispatch="off").report()["dispatch"]
    assert off["choices"] == {DIRECT: 1} and off["sources"] == {"off": 1}


def test_decide_refuses_inaccurate_candidates_and_memory_strategy_takes_the_smallest():
    entry = {"candidates": {DIRECT: {"ms": 3.0, "error": 0.0, "scratch_bytes": 0},
                            WINOGRAD[2]: {"ms": 2.0, "error": ERROR_LIMIT / 2, "scratch_bytes": 100},
                            WINOGRAD[4]: {"ms": 1.0, "error": ERROR_LIMIT * 2, "scratch_bytes": 50}}}
    assert decide(entry, "latency") == WINOGRAD[2]
    assert decide(entry, "memory") == DIRECT


def test_memory_strategy_compiles_direct_and_plans_less(tmp_path):
    model = _conv(32, 32, 16, 16, 1)
    store = _store_choosing(tmp_path, model, WINOGRAD[4])
    fast = compiler.compile(model, tuning="off", cache_dir=store).report()
    small = compiler.compile(model, tuning="off", cache_dir=store, strategy="memory").report()
    assert fast["dispatch"]["choices"] == {WINOGRAD[4]: 1} and small["dispatch"]["choices"] == {DIRECT: 1}
    assert small["memory"]["arena_bytes"] < fast["memory"]["arena_bytes"]


def test_inspect_prints_the_choices(tmp_path):
    path = tmp_path / "conv.onnx"
    onnx.save(_conv(16, 16, 8, 8, 1), str(path))
    out = relaxc("inspect", str(path), "--tuning", "off", "--dispatch-mode", "heuristic", "--dispatch")
    assert out.returncode == 0, out.stderr
    assert "dispatch: 1 winograd4 (1 rule)" in out.stdout and "conv2d_nchwc-1x1x8x8x16" in out.stdout

