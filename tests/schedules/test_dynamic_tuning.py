"""Tuning a model with dynamic dims: its kernels tuned as static instances at the named sizes,
each record relaxed onto the dynamic kernel, checked and timed against the default, replayed."""

import logging
import os

import numpy as np
import pytest
from tvm import s_tir, te, tirx

import relaxc
from relaxc.passes.ir import at_sizes
from relaxc.schedules import cache, decisions, dynamic_tuning
from relaxc.schedules.dynamic import DoesNotReplay, on_dynamic
from relaxc.support import targets
from relaxc.support.store_files import DYNAMIC_FILE
from tests import reference
from tests.schedules.test_dynamic_extents import TARGET, _run, _scaled
from tests.test_dynamic import _dynamic_cnn

BOUNDS = {"batch": 8}


def _tiled_at(func: tirx.PrimFunc, rows: int) -> s_tir.Schedule:
    """The static kernel at ``rows`` scheduled as MetaSchedule would: a sampled tiling of the rows."""
    sch = s_tir.Schedule(at_sizes(func, {"n": rows}))
    i, j = sch.get_loops(sch.get_sblock("y"))
    tiles = sch.sample_perfect_tile(i, n=2, decision=[rows // 8, 8])
    sch.parallel(sch.split(i, tiles)[0])
    sch.vectorize(j)
    return sch


def test_a_sampled_tiling_relaxes_to_whole_tiles_and_a_remainder():
    """A tile TVM cannot sample on a dynamic loop keeps its inner factor; the outer one rounds up,
    so every size runs, not only multiples of the tile. Exactly it would not apply."""
    n = tirx.Var("n", "int64")
    func = _scaled(n)
    static = _tiled_at(func, 64)
    with pytest.raises(DoesNotReplay):
        on_dynamic(static.trace, func)
    sch = on_dynamic(static.trace, func, exact=False)
    assert "T.parallel" in sch.mod["main"].script() and "T.vectorized" in sch.mod["main"].script()
    for rows in (1, 7, 64, 113):
        x, y = _run(sch.mod["main"], rows)
        np.testing.assert_array_equal(y, x * 2 + 1)


def test_tune_sizes_are_checked_and_combined():
    assert dynamic_tuning.tune_sizes({"batch": 4, "sequence": 384}, {"sequence": [128, 16]}) == [
        {"batch": 4, "sequence": 16}, {"batch": 4, "sequence": 128}]  # a dim not named: its bound
    with pytest.raises(relaxc.UserError, match=r"tune sizes of 'sequence' must be whole numbers in 1..384"):
        dynamic_tuning.tune_sizes({"sequence": 384}, {"sequence": [512]})
    with pytest.raises(relaxc.UserError, match=r"tune sizes name dim\(s\) \['seq'\]"):
        dynamic_tuning.tune_sizes({"sequence": 384}, {"seq": [16]})
    checks = dynamic_tuning.check_sizes({"batch": 4, "sequence": 384}, [{"batch": 4, "sequence": 128}])
    assert {c["sequence"] for c in checks} == {1, 2, 7, 33, 128, 129, 384}
    assert {c["batch"] for c in checks} == {1, 2, 4}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("dynamic-records"))
    summary = relaxc.tune(_dynamic_cnn(), dim_bounds=BOUNDS, tune_sizes={"batch": [4]}, trials=16,
                            cache_dir=directory)
    return directory, summary


def test_each_dynamic_kernel_is_tuned_at_the_sizes_named_and_decided(tuned):
    directory, summary = tuned
    dynamic = summary["dynamic"]
    assert dynamic["tuned_at"] == [{"batch": 4}] and dynamic["kernels"] > 0
    entries = decisions.read_entries(os.path.join(directory, cache.target_key(TARGET), DYNAMIC_FILE))
    assert sorted(dynamic["records_chosen"] + dynamic["default_chosen"]) == sorted(e["task"] for e in entries.values())
    for entry in entries.values():
        if entry["ms"]:  # timed: the default and at least one record that passed its checks
            assert "default" in entry["ms"] and entry["checked_at"]
            assert {c["batch"] for c in entry["checked_at"]} == {1, 2, 4, 5, 7, 8}
        if entry["choice"] != "default":
            assert entry["ms"][entry["choice"]] < entry["ms"]["default"] and entry["record"] is not None


def test_a_compile_replays_the_decisions_and_matches_at_every_size(tuned):
    directory, summary = tuned
    model = _dynamic_cnn()
    art = relaxc.compile(model, dim_bounds=BOUNDS, cache_dir=directory)
    report = art.report()["tuning"]
    assert report["missing"] == [] and report["records_not_applied"] == {}
    assert report["selected"] == report["tasks"]
    assert set(summary["dynamic"]["default_chosen"]) <= set(report["chose_default"])
    for batch in (1, 3, 4, 8):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 32, 32)).astype(np.float32)
        reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, {"x": x}))


def test_a_record_that_disagrees_with_the_default_is_not_used(tuned, tmp_path, monkeypatch, caplog):
    directory, _ = tuned
    monkeypatch.setattr(dynamic_tuning, "_agrees", lambda got, want: False)
    copy = tmp_path / "store"
    relaxc.load_cache(relaxc.save_cache(str(tmp_path / "records.tar.gz"), directory), str(copy))
    os.remove(os.path.join(copy, cache.target_key(TARGET), DYNAMIC_FILE))
    with caplog.at_level(logging.INFO, logger="relaxc"):
        summary = relaxc.tune(_dynamic_cnn(), dim_bounds=BOUNDS, tune_sizes={"batch": [4]}, trials=0,
                                cache_dir=str(copy))
    assert summary["dynamic"]["records_chosen"] == []
    assert all(why == {label: "differs from the default schedule at {'batch': 1}" for label in why}
               for why in summary["dynamic"]["records_not_used"].values())
    assert "differs from the default schedule at {'batch': 1}" in caplog.text


def test_the_decisions_travel_with_the_store(tuned, tmp_path):
    directory, _ = tuned
    archive = relaxc.save_cache(str(tmp_path / "records.tar.gz"), directory)
    relaxc.load_cache(archive, str(tmp_path / "loaded"))
    key = cache.target_key(targets.resolve("cpu"))
    assert (decisions.read_entries(os.path.join(tmp_path, "loaded", key, DYNAMIC_FILE))
            == decisions.read_entries(os.path.join(directory, key, DYNAMIC_FILE)))


def test_what_dynamic_tuning_refuses():
    with pytest.raises(relaxc.UserError, match="tune sizes size the dims a model keeps dynamic"):
        relaxc.tune(reference.small_cnn(), tune_sizes={"batch": [4]}, trials=0)
    with pytest.raises(relaxc.UserError, match="selection='sequence' times the model at one size"):
        relaxc.tune(_dynamic_cnn(), dim_bounds=BOUNDS, selection="sequence", trials=0)
    with pytest.raises(relaxc.UserError, match="tuning='tune' tunes kernels of static extents"):
        relaxc.compile(_dynamic_cnn(), dim_bounds=BOUNDS, tuning="tune")


def test_the_command_line_names_the_tune_sizes(tmp_path, capsys):
    from relaxc import cli, frontend

    path = frontend.models.bundled_path("onnx:squeezenet")  # any model: refused before it is read
    assert cli.main(["tune", path, "-q", "--dim-bound", "batch=8", "--tune-sizes", "batch=4,9", "--trials", "0"]) == 2
    assert "tune sizes of 'batch' must be whole numbers in 1..8 (its bound), not [4, 9]" in capsys.readouterr().err


def test_kernels_not_tuned_stay_undecided(tmp_path):
    """A tuning run limited to some kernels decides those alone: the others stay without a
    record (report()["tuning"]["missing"]), not decided for the default."""
    summary = relaxc.tune(_dynamic_cnn(), dim_bounds=BOUNDS, tune_sizes={"batch": [4]}, trials=8,
                            kernels=("mean*",), cache_dir=str(tmp_path))
    assert summary["dynamic"]["kernels"] == 1
    report = relaxc.compile(_dynamic_cnn(), dim_bounds=BOUNDS, cache_dir=str(tmp_path)).report()["tuning"]
    assert "mean" not in report["missing"] and len(report["missing"]) == report["tasks"] - 1
