"""Tuning records as a cache: tune a few trials, replay, strict, resume, corrupt lines, kill -9,
concurrent tuners, fingerprints, and strict replay of the committed logs (CI never tunes there)."""

import glob
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import shutil
import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

import relaxc
from relaxc import frontend
from relaxc.build.report import summary
from relaxc.build import tuning as relaxc_tuning
from relaxc.schedules import (cache, decisions, dispatch_sequence, maintenance, record_files, replay, selection,
                               sequence, trials)
from relaxc.support import targets, versions
from relaxc.schedules.cache import RecordStore
from relaxc.schedules.decisions import DecisionStore
from relaxc.support.store_files import DATABASE_FILES, DISPATCH_FILE, PACKED
from tests import reference

from tests.helpers import ROOT, env, run_cli, relaxc_command

ZNVER3 = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}  # the target the committed logs are for


def _record_lines(store_dir: str) -> list[str]:
    with open(os.path.join(store_dir, "database_tuning_record.json")) as f:
        return [line for line in f if line.strip()]


def _tune_cli(model_file, log_dir, *extra):
    return relaxc_command("tune", model_file, "--cache-dir", log_dir, "-q", *extra)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """small_cnn tuned for 2 trials on each of 3 kernels (a partial store)."""
    log_dir = tmp_path_factory.mktemp("records")
    summary = relaxc.tune(reference.small_cnn(), trials=6, trials_per_task=2, cache_dir=str(log_dir))
    return log_dir, summary


def _kernels(summary: dict) -> int:
    """small_cnn's kernels: 9 (its pooled map's blocked-to-NCHW reshape is a view), two more for each
    of its two 3x3 convs that dispatch made a Winograd one (three kernels instead of one), as tuning
    measured them on this CPU."""
    assert summary["dispatch"]["sources"] == {"measured": 2}  # tune measures dispatch first
    return 9 + 2 * sum(n for choice, n in summary["dispatch"]["choices"].items() if choice != "direct")


def test_tune_writes_records_and_a_manifest(tuned):
    log_dir, summary = tuned
    store_dir = summary["cache_dir"]
    assert store_dir == os.path.join(str(log_dir), cache.target_key(targets.resolve("cpu")))
    assert summary["tasks"] == _kernels(summary) and summary["records_before"] == 0
    assert 1 <= summary["records_after"] == len(_record_lines(store_dir))
    manifest = json.load(open(os.path.join(store_dir, "manifest.json")))
    assert manifest["versions"]["tvm"] == versions.versions()["tvm"]
    (entry,) = manifest["fingerprints"].values()
    assert entry["model"] == "test" and len(entry["tasks"]) == _kernels(summary) and entry["trials"] >= 1


def test_replay_applies_records_and_strict_names_the_rest(tuned):
    log_dir, summary = tuned
    n = _kernels(summary)
    assert summary["defaults_recorded"] == n  # every kernel's default schedule, measured
    art = relaxc.compile(reference.small_cnn(), cache_dir=str(log_dir), tuning="strict", backends="relaxc")
    report = art.report()["tuning"]
    assert report["mode"] == "strict" and report["tasks"] == report["tasks_with_records"] == n
    assert report["missing"] == [] and report["selected"] == n
    schedules = art.report()["schedules"]  # a kernel whose default won the selection keeps the default schedule
    assert schedules.get("tuned", 0) == n - len(report["chose_default"]) == n - sum(
        n for kind, n in schedules.items() if kind != "tuned")
    inputs = reference.random_inputs(art.inputs)
    outputs = reference.relaxc_run(art, inputs)
    reference.assert_matches(outputs, reference.ort_run(reference.small_cnn(), inputs))
    again = relaxc.compile(reference.small_cnn(), cache_dir=str(log_dir))  # replay is deterministic
    assert all(np.array_equal(a, b) for a, b in zip(outputs, again.run(inputs)))
    other = relaxc.compile(reference.branchy_cnn(), cache_dir=str(log_dir)).report()["tuning"]
    assert other["missing"] and other["tasks_with_records"] + len(other["missing"]) == other["tasks"]
    with pytest.raises(relaxc.UserError, match=rf"tuning='strict': {len(other['missing'])} of {other['tasks']} "
                                                 rf"kernels have no tuning record that applies in .*{other['missing'][0]}"):
        relaxc.compile(reference.branchy_cnn(), cache_dir=str(log_dir), tuning="strict", backends="relaxc")
    off = relaxc.compile(reference.small_cnn(), cache_dir=str(log_dir), tuning="off").report()
    assert off["tuning"]["tasks_with_records"] == 0 and "tuned" not in off["schedules"]


def test_tuning_ends_by_choosing_each_kernel_by_measurement(tuned, tmp_path):
    log_dir, summary = tuned
    n = _kernels(summary)
    assert summary["selection"]["selected"] == summary["selection"]["kernels_with_choice"] == n
    chosen = RecordStore.of(str(log_dir), targets.resolve("cpu")).selections()
    assert len(chosen) == n
    for entry in chosen.values():
        assert entry["candidates"] >= 2 and entry["records"] >= 1
        assert entry["fastest_ms"] <= entry["ms"] <= entry["fastest_ms"] * (1 + selection.TOLERANCE)
        assert (entry["choice"] == "default") == (entry["record"] is None)
    defaults = sorted(e["task"] for e in chosen.values() if e["choice"] == "default")
    assert relaxc.compile(reference.small_cnn(), cache_dir=str(log_dir)).report()["tuning"]["chose_default"] == defaults
    # a rerun with nothing new measures nothing again; --reselect measures every kernel again
    again = relaxc.tune(reference.small_cnn(), trials=0, cache_dir=str(log_dir))
    assert again["trials"] == 0 and again["selection"]["selected"] == 0
    copy = tmp_path / "copy"
    shutil.copytree(log_dir, copy)
    proc = run_cli("tune", "onnx:squeezenet", "--trials", "0", "--cache-dir", copy)  # no records: nothing to select
    assert proc.returncode == 0 and '"selected": 0' in proc.stdout
    reselected = relaxc.tune(reference.small_cnn(), trials=0, reselect=True, cache_dir=str(copy))
    assert reselected["selection"]["selected"] == n
    one = sorted(e["task"] for e in chosen.values())[0]  # --kernels limits the selection too
    limited = relaxc.tune(reference.small_cnn(), trials=0, reselect=True, kernels=[one], cache_dir=str(copy))
    assert limited["selection"]["selected"] == 1 and limited["selection"]["kernels_with_choice"] == n


def test_selection_in_sequence_chooses_by_time_in_the_model_and_replay_applies_it(tuned, tmp_path, monkeypatch):
    """A selection in sequence, replayed; then a second one whose candidates all tie (times forced:
    with real ones a loaded machine may change every choice), so every choice stays and is not
    rewritten."""
    log_dir, _ = tuned
    copy = tmp_path / "copy"
    shutil.copytree(log_dir, copy)
    summary = relaxc.tune(reference.small_cnn(), trials=0, selection="sequence", cache_dir=str(copy))
    result = summary["selection"]
    assert result["selected"] == len(result["kernels"]) >= 1 and result["runs_per_candidate"] == sequence.RUNS
    # by workload key: a dispatch change leaves the entries of the kernels it replaced, maybe under the same names
    chosen = RecordStore.of(str(copy), targets.resolve("cpu")).selections()
    for name, kernel in result["kernels"].items():
        entry = chosen[kernel["key"]]
        assert entry["task"] == name and entry["measured"] == "in sequence, test" and entry["choice"] == kernel["choice"]
        times = kernel["candidates_ms"]
        assert len(times) == entry["candidates"] >= 2 and kernel["before"] in times
        rounding = 1e-4  # the times are kept to 0.1 us, the tie rule compares them unrounded (kernels of 7 us here)
        assert entry["ms"] == times[kernel["choice"]] <= min(times.values()) * (1 + selection.TOLERANCE) + rounding
        if kernel["choice"] != kernel["before"]:  # a choice changes only for a measurable difference
            assert times[kernel["before"]] > min(times.values()) * (1 + selection.TOLERANCE) - rounding
    assert result["changed"] == sorted(n for n, k in result["kernels"].items() if k["choice"] != k["before"])
    dispatched = summary["dispatch_in_sequence"]
    stored = DecisionStore(RecordStore.of(str(copy), targets.resolve("cpu")), "dispatch").load()
    assert dispatched["workloads"] == len(dispatched["decisions"]) >= 1  # small_cnn's 20 -> 20 conv at least
    for key, decision in dispatched["decisions"].items():
        assert stored[key]["in_sequence"]["choice"] == decision["choice"] and stored[key]["in_sequence"]["model"] == "test"
        assert decision["before"] in decision["ms"] and set(decision["ms"]) <= set(stored[key]["candidates"])
    untuned = dispatched.get("untuned", [])  # trials=0: an implementation chosen now may lack records
    art = relaxc.compile(reference.small_cnn(), cache_dir=str(copy), tuning="replay" if untuned else "strict",
                         backends="relaxc")
    assert art.report()["tuning"]["missing"] == untuned
    made = {c["workload"]: c["choice"] for c in art.report()["dispatch"]["convolutions"]}
    assert all(made[key] == decision["choice"] for key, decision in dispatched["decisions"].items())
    assert all((name in art.report()["tuning"]["chose_default"]) == (kernel["choice"] == "default")
               for name, kernel in result["kernels"].items())

    def tie(kernels, calls, runs):
        for kernel in kernels:
            for candidate in kernel.candidates:
                candidate.runs_ms = [1.0] * runs

    monkeypatch.setattr(sequence, "_time", tie)
    monkeypatch.setattr(dispatch_sequence, "time_variants", lambda variants, runs: dict.fromkeys(variants, 1.0))
    again = relaxc.tune(reference.small_cnn(), trials=0, selection="sequence", cache_dir=str(copy))["selection"]
    assert again["changed"] == [] and again["kernels"]
    second = RecordStore.of(str(copy), targets.resolve("cpu")).selections()
    kept = [k["key"] for k in again["kernels"].values() if chosen.get(k["key"], {}).get("measured") == "in sequence, test"]
    assert kept and all(second[key] == chosen[key] for key in kept)  # a choice that stays is not rewritten
    assert again["rewritten"] == len(again["kernels"]) - len(kept)
    inputs = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(reference.small_cnn(), inputs))


def test_after_a_dispatch_change_only_the_untuned_kernels_are_tuned_then_selected(monkeypatch):
    """relaxc.build.tuning._in_sequence with its steps replaced: the new implementation's kernels (those
    without records) get the trials, not every kernel short of its share; then the selection."""
    missing = [["winograd_product2", "winograd_input2"], []]  # before tuning them, after

    class Replayed:
        def __init__(self):
            self.missing = missing[0] if calls.count("tune") == 0 else missing[1]

        def report(self):
            return {"tuning": {"missing": self.missing}}

        def module(self, phase):
            return phase

    calls, tuned_with = [], {}
    monkeypatch.setattr(relaxc_tuning, "_dispatch_in_sequence", lambda art, build, cache_dir: {"changed": ["w"]})
    monkeypatch.setattr(relaxc_tuning, "_select_in_sequence", lambda art, kernels, cache_dir: calls.append("select") or {})

    def tune_kernels(mod, **kwargs):
        calls.append("tune")
        tuned_with.update(kwargs, mod=mod)
        return {"trials": 10}

    summary = relaxc_tuning._in_sequence(Replayed, tune_kernels, relaxc.TuneOptions(trials=10), None)
    assert calls == ["tune", "select"] and tuned_with == {"mod": "fuse", "select": False,
                                                          "kernels": ("winograd_product2", "winograd_input2")}
    assert summary["dispatch_in_sequence"]["untuned"] == [] and summary["tuned_after_dispatch"] == {"trials": 10}
    calls.clear()
    summary = relaxc_tuning._in_sequence(Replayed, tune_kernels, relaxc.TuneOptions(trials=0), None)
    assert calls == ["select"] and summary["dispatch_in_sequence"]["untuned"] == missing[0]


def test_an_invalid_selection_file_is_ignored_with_a_warning(tuned, tmp_path, caplog):
    log_dir, _ = tuned
    copy = tmp_path / "copy"
    shutil.copytree(log_dir, copy)
    store = RecordStore.of(str(copy), targets.resolve("cpu"))
    with open(store.selection_path, "w") as f:
        f.write('{"kernels": [')
    with caplog.at_level("WARNING", logger="relaxc"):
        report = relaxc.compile(reference.small_cnn(), cache_dir=str(copy), tuning="strict",
                                backends="relaxc").report()["tuning"]
    assert f"{store.selection_path} is not a valid selection file" in caplog.text
    assert report["selected"] == 0 and report["missing"] == []  # the best records still apply
    proc = run_cli("cache", "verify", "--cache-dir", copy)
    assert proc.returncode == 1 and "invalid selection file selected.json" in proc.stdout


def test_a_packed_store_replays_like_the_plain_one(tuned, tmp_path):
    """``relaxc cache pack``: the form relaxc ships its stores in (database files gzipped), read only."""
    log_dir, _ = tuned
    packed = tmp_path / "packed"
    proc = run_cli("cache", "pack", packed, "--cache-dir", log_dir)
    key = cache.target_key(targets.resolve("cpu"))
    assert proc.returncode == 0 and key in proc.stdout, proc.stderr
    assert sorted(os.listdir(packed / key)) == sorted(
        [name + PACKED for name in DATABASE_FILES] + ["dispatch.json", "manifest.json", "selected.json"])
    plain, shipped = RecordStore(str(log_dir / key)), RecordStore(str(packed / key))
    assert cache.stores(str(packed)) == [key] and shipped.describe()["records"] == plain.describe()["records"]
    hashes = list(plain.selections())
    assert shipped.records_of(hashes) == plain.records_of(hashes) and shipped.selections() == plain.selections()
    assert all(tvm_ffi.structural_equal(shipped.workload(h), plain.workload(h)) for h in hashes)
    reports = [relaxc.compile(reference.small_cnn(), cache_dir=str(root), tuning="strict",
                              backends="relaxc").report()["tuning"]
               for root in (log_dir, packed)]
    assert reports[0]["tasks_with_records"] == reports[1]["tasks_with_records"] == reports[0]["tasks"]


def test_the_users_records_lie_over_the_shipped_store(tuned, tmp_path, monkeypatch):
    """With no ``cache_dir``: the user's store, where records and measurements are written, over
    the one relaxc ships, whose choices apply where the user has none; a ``cache_dir`` is alone."""
    log_dir, _ = tuned
    target = targets.resolve("cpu")
    monkeypatch.setattr(cache, "shipped_root", lambda: str(log_dir))
    monkeypatch.setenv("RELAXC_CACHE_DIR", str(tmp_path / "user"))
    store = cache.store_for(None, target)
    assert store.dir == str(tmp_path / "user" / cache.target_key(target)) and store.base.dir.startswith(str(log_dir))
    assert cache.store_for(str(tmp_path / "other"), target).base is None
    shipped = store.base.selections()
    mine = next(iter(shipped))
    with store.lock():
        store.save_selections({mine: {**shipped[mine], "chosen_by": "me"}})
    assert store.selections()[mine]["chosen_by"] == "me" and store.selections().keys() == shipped.keys()
    assert RecordStore(store.dir).selections().keys() == {mine}  # the shipped choices are not copied
    DecisionStore(store, "dispatch").save("w", {"candidates": {}})
    assert DecisionStore(store, "dispatch").load().keys() == DecisionStore(store.base, "dispatch").load().keys() | {"w"}
    assert decisions.read_entries(os.path.join(store.dir, DISPATCH_FILE)).keys() == {"w"}
    report = relaxc.compile(reference.small_cnn(), tuning="strict", backends="relaxc").report()["tuning"]
    assert report["shipped"] == store.base.dir and report["missing"] == []
    listed = run_cli("cache", "list").stdout.splitlines()  # another process: the checkout's stores beneath
    assert listed[0] == f"your cache: {tmp_path / 'user'}"  # a choice and a measurement only
    assert listed[1].startswith(f"  {os.path.basename(store.dir)}: 0 records")
    beneath = listed.index(f"beneath it, relaxc's: {os.path.join(ROOT, 'tuning_logs')}")
    assert {line.split(":")[0].strip() for line in listed[beneath:] if line.startswith("  llvm-")} == \
        set(cache.stores(os.path.join(ROOT, "tuning_logs")))


def test_the_selection_prefers_the_cheaper_build_among_equally_fast_kernels():
    def made(label, ms, build_s):
        return selection.Candidate(label, schedule=None, build_s=build_s, runs_ms=[ms])
    slow_build, cheap, slow_run = made("a", 1.00, 1.0), made("b", 1.02, 0.1), made("c", 1.2, 0.05)
    assert selection.choose([slow_build, cheap, slow_run]) is cheap  # within 3%, 10x cheaper to build
    fast, about_as_cheap = made("a", 1.00, 0.10), made("b", 1.01, 0.08)
    assert selection.choose([about_as_cheap, fast]) is fast  # builds within 50 ms count as equal


def test_capped_unroll_replays_to_the_capped_kernel():
    """A committed record unrolled 512 steps, capped to 16: the trace still replays, to loops
    unrolled at most 16 steps."""
    parse = tvm_ffi.get_global_func("ffi.json.Parse")
    store = os.path.join(ROOT, "tuning_logs", "llvm-znver3-2c")
    with open(os.path.join(store, "database_tuning_record.json")) as f:
        line = next(line for line in f if re.search(r'\["Annotate",\["\w+",512\],\["pragma_auto_unroll_max_step"\]', line))
    index, entry = json.loads(line)
    with open(os.path.join(store, "database_workload.json")) as f:
        workload_line = next(line for number, line in enumerate(f) if number == index)
    workload = ms.database.Workload.from_json(parse(workload_line))

    def unroll_steps(record) -> set[int]:
        sch = tvm.s_tir.Schedule(workload.mod)
        selection.apply_trace(record, sch)
        steps = set()
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
        while blocks:
            block = blocks.pop()
            blocks += sch.get_child_blocks(block)
            steps |= {int(sch.get(loop).annotations[selection.UNROLL_ATTR]) for loop in sch.get_loops(block)
                      if selection.UNROLL_ATTR in sch.get(loop).annotations}
        return steps

    assert 512 in unroll_steps(entry)
    capped = selection.capped_unroll(entry)
    assert unroll_steps(capped) and max(unroll_steps(capped)) <= selection.UNROLL_CAP
    assert selection.capped_unroll(capped) is None  # nothing left to cap


def test_a_record_replays_on_a_kernel_of_its_structure_whose_blocks_are_named_otherwise():
    """EfficientNet-B0's average pool, selected with a record whose trace names its blocks
    (``lv397_red`` and the ``lv397_red_rf`` its rfactor makes), replays on MobileNetV2's pool of the
    same structure whose block is ``lv375_red``: the workload hash ignores names, the trace did not."""
    store = RecordStore(os.path.join(ROOT, "tuning_logs", "llvm-emeraldrapids-2c"))
    key, entry = next((k, e) for k, e in store.selections().items() if '"lv397_red_rf"' in json.dumps(e["record"]))
    recorded = store.workload(key)
    renamed = tvm.script.from_source(recorded.script().replace("lv397", "lv375"))
    assert selection.block_names(tvm.s_tir.Schedule(renamed)) != selection.block_names(tvm.s_tir.Schedule(recorded))
    mod = tvm.IRModule({"main": renamed})
    assert cache.workload_hash(mod) == key
    with pytest.raises(tvm.s_tir.ScheduleError, match="lv397_red"):
        selection.apply_trace(entry["record"], tvm.s_tir.Schedule(mod))
    sch = tvm.s_tir.Schedule(mod)
    selection.apply_trace(entry["record"], sch, lambda: recorded)
    expected = tvm.s_tir.Schedule(tvm.IRModule({"main": recorded}))
    selection.apply_trace(entry["record"], expected)
    assert sch.mod.script() == expected.mod.script().replace("lv397", "lv375")  # the same schedule
    replayed, failed = replay.apply_traces(tvm.IRModule({"pool": renamed}), {key: entry["record"]}, store)
    assert failed == {} and 'T.sblock("lv375_red_rf_update")' in replayed["pool"].script()  # as compile() replays
    unmapped, failed = replay.apply_traces(tvm.IRModule({"pool": renamed}), {key: entry["record"]})  # no store
    assert "lv397_red" in failed[key] and unmapped["pool"].same_as(renamed)  # the default schedule's to make


def test_a_record_that_does_not_replay_leaves_its_kernel_to_the_default_and_says_so(tuned, tmp_path, caplog):
    """A selected record whose trace names a block its kernel does not have (and no workload maps
    it): replay warns, names the kernel in the report, schedules it by default; strict refuses."""
    log_dir, _ = tuned
    copy = tmp_path / "records"
    shutil.copytree(log_dir, copy)
    store = RecordStore.of(str(copy), targets.resolve("cpu"))
    chosen = store.selections()
    key, record, first = next((k, r, i) for k, found in sorted(store.records_of(chosen).items())
                              for r in (json.loads(line)[1] for line in found)
                              for i in r[0][0] if i[0] == "GetSBlock" and i[2][0] != "root")
    first[2][0] = "no_such_block"
    entry = {**chosen[key], "choice": "record 1", "record": record}  # selected, whatever won before
    with open(os.path.join(store.dir, "database_workload.json"), "w"):
        pass  # no workload to map the names through
    store.save_selections({key: entry})
    with caplog.at_level(logging.WARNING, logger="relaxc"):
        art = relaxc.compile(reference.small_cnn(), cache_dir=str(copy))
    report = art.report()["tuning"]
    (name, why), = report["records_not_applied"].items()
    assert "no_such_block" in why and name in report["missing"] and entry["task"] == name
    assert any("do not apply" in r.getMessage() and name in r.getMessage() for r in caplog.records)
    inputs = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(reference.small_cnn(), inputs))
    with pytest.raises(relaxc.UserError, match=rf"no tuning record that applies .*{name}"):
        relaxc.compile(reference.small_cnn(), cache_dir=str(copy), tuning="strict", backends="relaxc")


def test_measured_kernels_get_indices_in_range():
    """Trials run on random arguments, but index tensors are zeros: random token ids made every run of
    BERT's embedding lookup fail, leaving it without a record."""
    (ids, values), = trials.alloc_arguments(tvm.cpu(), [["TENSOR", "int64", [4, 8]], ["TENSOR", "float32", [256]]], 1)
    assert ids.dtype == "int64" and not ids.numpy().any()
    assert values.numpy().std() > 0


def test_a_rerun_resumes_instead_of_starting_over(tuned):
    log_dir, first = tuned
    again = relaxc.tune(reference.small_cnn(), trials=2, trials_per_task=2, cache_dir=str(log_dir))
    assert again["records_before"] == first["records_after"] < again["records_after"]
    assert again["tasks_tuned"] < first["tasks_tuned"]  # kernels with their 2 records are not tuned again


def test_corrupted_lines_are_skipped_with_a_warning(tuned, tmp_path, caplog):
    log_dir, summary = tuned
    copy = tmp_path / "copy"
    shutil.copytree(log_dir, copy)
    store = RecordStore.of(str(copy), targets.resolve("cpu"))
    records = copy / os.path.basename(store.dir) / "database_tuning_record.json"
    good = records.read_text()
    records.write_text('{"truncated": [1, 2\n' + good + "garbage that is not json\n")
    selected = relaxc.compile(reference.small_cnn(), cache_dir=str(copy)).report()["tuning"]
    assert selected["selected"] == selected["tasks_with_records"] == _kernels(summary)  # replay reads no record
    os.remove(store.selection_path)  # without a selection, replay applies the best records
    copies = lambda: set(glob.glob(os.path.join(tempfile.gettempdir(), "relaxc-records-*")))  # noqa: E731
    before = copies()
    with caplog.at_level("WARNING", logger="relaxc"):
        art = relaxc.compile(reference.small_cnn(), cache_dir=str(copy))
    assert copies() == before  # the clean copy it read from is gone
    assert f"{records} line 1 is not a valid record" in caplog.text
    assert f"line {len(good.splitlines()) + 2} is not a valid record" in caplog.text
    clean = relaxc.compile(reference.small_cnn(), cache_dir=str(log_dir))
    assert art.report()["tuning"]["tasks_with_records"] == clean.report()["tuning"]["tasks_with_records"]
    assert records.read_text().startswith('{"truncated"')  # a reader never rewrites the store


def test_records_that_do_not_apply_are_dropped_instead_of_refusing_the_store(tuned, tmp_path, caplog):
    """MetaSchedule can write a record whose trace it cannot apply again (TVM 0.27: RFactor records
    of a mean), and JSONDatabase then refuses every record of the store."""
    log_dir, _ = tuned
    copy = tmp_path / "copy"
    shutil.copytree(log_dir, copy)
    store = RecordStore.of(str(copy), targets.resolve("cpu"))
    records = copy / os.path.basename(store.dir) / "database_tuning_record.json"
    lines = records.read_text().splitlines(keepends=True)
    broken = lines[0].replace('["GetSBlock",[],["', '["GetSBlock",[],["no_such_block_', 1)
    assert broken != lines[0]
    records.write_text("".join(lines) + broken)
    with pytest.raises(RuntimeError):
        record_files.json_database(store.dir, allow_missing=False)
    with caplog.at_level("WARNING", logger="relaxc"):
        assert len(store.database(writable=False).get_all_tuning_records()) == len(lines)
    assert f"record {len(lines) + 1} does not apply to its kernel; dropped" in caplog.text
    assert records.read_text().endswith(broken)  # a reader never rewrites the store
    assert len(store.database(writable=True).get_all_tuning_records()) == len(lines)
    assert records.read_text() == "".join(lines)  # a writer (tuning) drops it for good


def test_cache_save_load_verify_merge_prune(tuned, tmp_path):
    log_dir, _ = tuned
    archive = relaxc.save_cache(str(tmp_path / "records.tar.gz"), cache_dir=str(log_dir))
    loaded = relaxc.load_cache(archive, cache_dir=str(tmp_path / "other"))
    key = cache.target_key(targets.resolve("cpu"))
    original = maintenance.describe_store(str(log_dir), key)
    assert loaded == {key: original["records"]}
    copy = maintenance.describe_store(str(tmp_path / "other"), key)
    assert copy["records"] == original["records"] and copy["workloads"] == original["workloads"]
    assert copy["models"] == original["models"] and copy["bad_lines"] == []
    measured = decisions.read_entries(str(log_dir / key / "dispatch.json"))  # tuning measured dispatch first
    assert measured and decisions.read_entries(str(tmp_path / "other" / key / "dispatch.json")) == measured
    # the loaded records replay like the originals
    replayed = relaxc.compile(reference.small_cnn(), cache_dir=str(tmp_path / "other")).report()["tuning"]
    assert replayed["tasks_with_records"] == original["workloads"]
    run = lambda *a: run_cli("cache", *a, timeout=300)  # noqa: E731
    assert run("verify", "--cache-dir", str(tmp_path / "other")).returncode == 0
    local = dict(measured)
    workload = next(iter(local))
    local[workload] = {**local[workload], "measured_on": "here"}
    del local[next(w for w in local if w != workload)]
    decisions.write_entries(str(tmp_path / "other" / key / "dispatch.json"), local)
    assert run("merge", str(log_dir), "--cache-dir", str(tmp_path / "other")).returncode == 0
    assert maintenance.describe_store(str(tmp_path / "other"), key)["records"] == 2 * original["records"]
    merged = decisions.read_entries(str(tmp_path / "other" / key / "dispatch.json"))
    assert merged.keys() == measured.keys() and merged[workload]["measured_on"] == "here"  # a local one stays
    assert f"{len(measured)} workloads measured in dispatch.json" in run("list", "--cache-dir", str(tmp_path / "other")).stdout
    proc = run("prune", "--cache-dir", str(tmp_path / "other"))
    assert proc.returncode == 0 and f"-> {original['workloads']} records" in proc.stdout
    with open(tmp_path / "other" / key / "database_tuning_record.json", "a") as f:
        f.write("{not json\n")
    (tmp_path / "other" / key / "layouts.json").write_text("{not json")
    proc = run("verify", "--cache-dir", str(tmp_path / "other"))
    assert proc.returncode == 1 and "unparsable line database_tuning_record.json:" in proc.stdout
    assert "layouts.json is not a valid decision file" in proc.stdout
    with pytest.raises(relaxc.UserError, match="not a relaxc cache archive"):
        relaxc.load_cache(str(log_dir / key / "manifest.json"), cache_dir=str(tmp_path / "x"))


def test_kill_minus_9_loses_no_measured_record(model_file, tmp_path):
    proc = subprocess.Popen(_tune_cli(model_file, tmp_path, "--trials", "40", "--trials-per-task", "4"),
                            env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    store = RecordStore.of(str(tmp_path), targets.resolve("cpu"))
    deadline = time.time() + 300
    while time.time() < deadline and (not store.exists() or len(_record_lines(store.dir)) < 2):
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    measured = [line for line in _record_lines(store.dir) if line.endswith("\n")]
    assert len(measured) >= 2
    summary = relaxc.tune(reference.small_cnn(), trials=1, trials_per_task=4, cache_dir=str(tmp_path))
    assert summary["records_before"] >= len(measured) - 1  # at most the line being written is lost
    assert store.bad_lines() == []


def test_two_tuners_on_one_directory_do_not_corrupt_it(model_file, tmp_path):
    cmd = _tune_cli(model_file, tmp_path, "--trials", "2", "--trials-per-task", "2")
    procs = [subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert not any("task_scheduler" in out for out, _ in outputs)  # -q: no MetaSchedule chatter either
    store = RecordStore.of(str(tmp_path), targets.resolve("cpu"))
    assert store.bad_lines() == []
    summaries = [json.loads(out[out.rindex('{\n  "tasks"'):]) for out, _ in outputs]
    assert sorted(s["records_before"] for s in summaries)[1] > 0  # the second waited for the first


# --- fingerprints ---------------------------------------------------------------------------------

def test_fingerprint_is_stable_across_processes_and_changes_with_its_inputs(monkeypatch):
    code = ("import relaxc; from tests import reference; "
            "print(relaxc.compile(reference.small_cnn(), tuning='off').fingerprint)")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), timeout=300)
    base = relaxc.compile(reference.small_cnn(), tuning="off")
    assert other.stdout.strip().splitlines()[-1] == base.fingerprint
    mod, target = base.module("fuse"), base.target
    options = {"layout_block": 8}
    assert versions.fingerprint(mod, target, options) == versions.fingerprint(mod, target, options)
    skylake = targets.resolve({"kind": "llvm", "mcpu": "skylake", "num-cores": 2})
    assert versions.fingerprint(mod, skylake, options) != versions.fingerprint(mod, target, options)
    monkeypatch.setattr(versions.tvm, "__version__", "0.28.0")
    assert versions.fingerprint(mod, target, options) != base.fingerprint
    monkeypatch.undo()
    changed = relaxc.compile(reference.small_cnn(seed=5), tuning="off")  # other weights
    assert changed.fingerprint != base.fingerprint


def test_replay_without_records_for_this_cpu_says_which_stores_exist(tmp_path, caplog):
    other = tmp_path / "llvm-othercpu-2c"
    other.mkdir()
    for name in DATABASE_FILES:
        (other / name).write_text("")
    with caplog.at_level(logging.INFO, logger="relaxc"):
        full = relaxc.compile(reference.small_cnn(), cache_dir=str(tmp_path)).report()
    report = full["tuning"]
    assert report["store"] is None and report["stores"] == ["llvm-othercpu-2c"]
    assert report["tune_command"].startswith("relaxc tune ") and f"--cache-dir {tmp_path}" in report["tune_command"]
    said = [r.getMessage() for r in caplog.records if "no tuning records for" in r.getMessage()]
    assert len(said) == 1 and "llvm-othercpu-2c" in said[0] and report["tune_command"] in said[0]
    assert all(r.levelno == logging.INFO for r in caplog.records if "no tuning records for" in r.getMessage())
    assert "stores: llvm-othercpu-2c" in summary(full, report["tune_command"])


# --- the committed logs: CI replays them and never tunes ------------------------------------------

EMERALDRAPIDS = {"kind": "llvm", "mcpu": "emeraldrapids", "num-cores": 2}  # AVX-512 Intel, 2 cores
ZNVER4 = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}  # AVX-512 AMD (Zen 4), 2 cores
ZNVER5 = {"kind": "llvm", "mcpu": "znver5", "num-cores": 2}  # AVX-512 AMD (Zen 5), 2 cores
COMMITTED = ([(ZNVER3, spec) for spec in ("onnx:resnet50", "onnx:vgg19", "onnx:squeezenet", "onnx:inception_v2", "zoo:bert")]
             + [(EMERALDRAPIDS, spec) for spec in ("onnx:resnet50", "onnx:vgg19")]
             + [(ZNVER4, spec) for spec in ("onnx:resnet50", "onnx:vgg19")]
             + [(ZNVER5, spec) for spec in ("onnx:resnet50", "onnx:vgg19", "zoo:vit_b16", "zoo:bert")])  # complete stores


def _runs_here(target: dict) -> bool:
    return targets.runs_on_host(targets.resolve(target))


@pytest.mark.slow
@pytest.mark.parametrize("target, spec", [
    pytest.param(target, spec, id=f"{target['mcpu']}-{spec}",
                 marks=pytest.mark.skipif(not _runs_here(target), reason=f"this CPU does not run {target['mcpu']} code"))
    for target, spec in COMMITTED])
def test_committed_logs_replay_strictly(target, spec):
    """CI's tuning-log replay: every kernel has a committed schedule chosen by measurement and every
    convolution a committed dispatch decision (strict never tunes nor measures), the model matches
    onnxruntime, and a second build replays to bit-identical outputs."""
    logs = os.path.join(ROOT, "tuning_logs")
    art = relaxc.compile(spec, target=target, tuning="strict", backends="relaxc", cache_dir=logs)
    report = art.report()
    assert set(report["dispatch"]["sources"]) <= {"stored"}
    tuning = report["tuning"]
    assert tuning["missing"] == [] and tuning["selected"] == tuning["tasks"]
    assert report["schedules"].get("tuned", 0) == tuning["tasks"] - len(tuning["chose_default"])
    inputs = reference.random_inputs(art.inputs, high=art.input_high)
    outputs = reference.relaxc_run(art, inputs)
    reference.assert_matches(outputs, reference.ort_session(frontend.load_model(spec)[0]).run(None, inputs))
    if spec == "onnx:resnet50":
        again = relaxc.compile(spec, target=target, tuning="strict", backends="relaxc", cache_dir=logs)
        assert again.fingerprint == art.fingerprint
        assert all(np.array_equal(a, b) for a, b in zip(outputs, again.run(inputs)))
