"""Subgraph backends: what relaxc cannot compile runs on onnxruntime or OpenVINO inside relaxc's
program (a call) or after it (the tail, for outputs whose shapes depend on the data); partitions
chosen by measurement are stored and replayed; artifacts with external subgraphs export and load."""

import gc
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import relaxc
from relaxc.build import backend_candidates, backend_choice, backend_costs, pipeline, profile
from relaxc.runtime import external
from relaxc.frontend import partition
from relaxc.build.report import plan_summary
from relaxc.schedules import default
from relaxc.support import turns
from tests import reference
from tvm import s_tir
from tvm.s_tir import dlight as dl

pytest.importorskip("onnxruntime")


@pytest.fixture(autouse=True)
def users_default_backends(monkeypatch):
    """This module is about the external backends: it compiles as users do, with the default mode
    (replay), where the rest of the suite runs relaxc's kernels alone (tests/conftest.py)."""
    monkeypatch.delenv("RELAXC_BACKENDS")


def _model(nodes, inputs, outputs, initializers=()):
    return reference._model(nodes, inputs, outputs, list(initializers), opset=17)


def _det_between_convs():
    """Conv -> Det (no TVM converter) -> Add: Det runs on onnxruntime, between relaxc's kernels."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), "w")
    two = numpy_helper.from_array(np.array(2, np.float32), "two")
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], name="conv"),
             helper.make_node("Det", ["a"], ["d"], name="det"),
             helper.make_node("Add", ["d", "two"], ["y"], name="add")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3, 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [weight, two])


def _nonzero_tail():
    two = numpy_helper.from_array(np.array(2, np.float32), "two")
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("NonZero", ["a"], ["picked"], name="nonzero"),
             helper.make_node("Add", ["x", "two"], ["y"], name="add")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                  [helper.make_tensor_value_info("picked", TensorProto.INT64, [2, None]),
                   helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], [two])


def _matches(art, model, seed=0):
    inputs = reference.random_inputs(art.inputs, seed=seed)
    outputs = art.run(inputs)
    reference.assert_matches(outputs, reference.ort_run(model, inputs))
    return inputs, outputs


def test_an_operator_relaxc_cannot_import_runs_on_onnxruntime_inside_the_program():
    model = _det_between_convs()
    art = relaxc.compile(model, tuning="off")
    _matches(art, model)
    backends = art.report()["backends"]
    assert [(s["backend"], s["placement"], s["ops"]) for s in backends["subgraphs"]] == \
        [("onnxruntime", "call", {"Det": 1})]
    assert "TVM's importer does not convert it" in backends["subgraphs"][0]["why"]
    assert "call_dps_packed" in art.ir("import") and "relaxc.runtime.external." in art.ir("import")


def test_profile_lists_external_calls_and_the_tail():
    """A call into a library and the tail are rows of the profile (kind external, the backend as
    schedule), timed alone as kernels are; the tail counts in end to end."""
    art = relaxc.compile(_det_between_convs(), tuning="off")
    found = profile.profile(art, reference.random_inputs(art.inputs))
    (row,) = [k for k in found.kernels if k.kind == "external"]
    assert row.schedule == "onnxruntime" and row.ms > 0 and row.lost_ms == 0.0
    assert any(k.kind != "external" for k in found.kernels)
    assert "of them external subgraphs" in found.table()
    tail = relaxc.compile(_nonzero_tail(), tuning="off")
    (row,) = [k for k in profile.profile(tail, reference.random_inputs(tail.inputs)).kernels if k.kind == "external"]
    assert row.name == tail.subgraphs[0].function and row.calls == 1


def test_a_dropped_artifact_frees_its_sessions():
    model = _det_between_convs()
    art = relaxc.compile(model, tuning="off")
    name = art.report()["backends"]["subgraphs"][0]["function"]
    assert name in external._OPEN
    del art
    gc.collect()
    assert name not in external._OPEN  # a measured choice's losing candidates free their libraries
    _matches(relaxc.compile(model, tuning="off"), model)  # opened again by the next


def test_relaxc_only_refuses_what_it_cannot_compile():
    with pytest.raises(relaxc.UnsupportedOperatorError, match="Det"):
        relaxc.compile(_det_between_convs(), tuning="off", backends="off")


def test_a_data_dependent_output_runs_after_the_program():
    model = _nonzero_tail()
    art = relaxc.compile(model, tuning="off")
    _matches(art, model)
    assert art.outputs[0] == ("picked", None, "int64")
    (sub,) = art.report()["backends"]["subgraphs"]
    assert (sub["placement"], sub["ops"]) == ("tail", {"NonZero": 1})


def test_overrides_pin_nodes_to_a_backend():
    pytest.importorskip("openvino")
    model = _det_between_convs()
    art = relaxc.compile(model, tuning="off", backend_overrides={"conv": "openvino"})
    _matches(art, model)
    placed = sorted((s["backend"], tuple(s["ops"])) for s in art.report()["backends"]["subgraphs"])
    assert placed == [("onnxruntime", ("Det",)), ("openvino", ("Conv",))]
    with pytest.raises(relaxc.UnsupportedOperatorError, match="cannot run on relaxc"):
        relaxc.compile(model, tuning="off", backend_overrides={"det": "relaxc"})
    with pytest.raises(relaxc.UserError, match="GLOB=BACKEND"):
        relaxc.compile(model, tuning="off", backend_overrides={"det": "tensorrt"})


def test_a_constant_read_across_a_boundary_is_copied_not_passed():
    """A Constant node placed on onnxruntime whose value relaxc's Reshape reads as its shape: each
    part gets its own copy (a shape passed as a runtime tensor is no shape TVM's importer takes)."""
    shape = helper.make_tensor("shape_value", TensorProto.INT64, [2], [4, 3])
    nodes = [helper.make_node("Constant", [], ["shape"], name="shape_const", value=shape),
             helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Reshape", ["a", "shape"], ["y"], name="reshape")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3]),
                    helper.make_tensor_value_info("shape", TensorProto.INT64, [2])])  # returned too
    art = relaxc.compile(model, tuning="off", backend_overrides={"shape_const": "onnxruntime", "relu": "onnxruntime"})
    _matches(art, model)
    backends = art.report()["backends"]
    assert "whole_model_because" not in backends
    assert [(s["backend"], s["ops"]) for s in backends["subgraphs"]] == [("onnxruntime", {"Relu": 1})]


def test_an_operator_no_backend_runs_is_refused_naming_it():
    nodes = [helper.make_node("Frobnicate", ["x"], ["y"], name="custom", domain="com.example")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.raises(relaxc.UnsupportedOperatorError, match="'custom'.*runs right on no installed backend"):
        relaxc.compile(model, tuning="off")


def test_a_model_without_external_subgraphs_compiles_as_before():
    art = relaxc.compile(reference.small_cnn(), tuning="off")
    assert art.report()["backends"]["subgraphs"] == []
    assert art.program_outputs is None


def test_export_and_load_keep_the_external_subgraphs(tmp_path):
    model = _det_between_convs()
    art = relaxc.compile(model, tuning="off")
    inputs, outputs = _matches(art, model)
    path = str(tmp_path / "det.so")
    manifest_path = art.export(path)
    with open(manifest_path) as f:
        manifest = json.load(f)
    (entry,) = manifest["external"]
    assert entry["backend"] == "onnxruntime" and os.path.isfile(tmp_path / entry["file"])
    loaded = relaxc.load(path)
    np.testing.assert_array_equal(loaded.run(inputs)[0], outputs[0])

    wrong_version = dict(manifest, external=[dict(entry, version="0.0.1")])
    with open(manifest_path, "w") as f:
        json.dump(wrong_version, f)
    with pytest.raises(relaxc.ExportError, match="compiled with onnxruntime 0.0.1"):
        relaxc.load(path)
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)
    with open(tmp_path / entry["file"], "ab") as f:
        f.write(b"x")
    with pytest.raises(relaxc.ExportError, match="does not match its manifest"):
        relaxc.load(path)


def test_the_tail_exports_and_loads(tmp_path):
    model = _nonzero_tail()
    art = relaxc.compile(model, tuning="off")
    inputs, outputs = _matches(art, model)
    art.export(str(tmp_path / "tail.so"))
    loaded = relaxc.load(str(tmp_path / "tail.so"))
    for got, want in zip(loaded.run(inputs), outputs):
        np.testing.assert_array_equal(got, want)


def test_concurrent_runs_with_an_external_call_are_identical():
    model = _det_between_convs()
    art = relaxc.compile(model, tuning="off")
    cases = [reference.random_inputs(art.inputs, seed=s) for s in range(8)]
    expected = [art.run(c)[0] for c in cases]

    def same_every_time(index):
        return all(np.array_equal(art.run(cases[index])[0], expected[index]) for _ in range(50))

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(same_every_time, range(8)))


def test_bad_values_in_an_external_subgraph_are_input_errors():
    data = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "table")
    nodes = [helper.make_node("Det", ["m"], ["d"], name="det"),
             helper.make_node("GatherElements", ["table", "i"], ["y"], name="gather")]
    model = _model(nodes, [helper.make_tensor_value_info("m", TensorProto.FLOAT, [2, 2]),
                           helper.make_tensor_value_info("i", TensorProto.INT64, [4, 3])],
                   [helper.make_tensor_value_info("d", TensorProto.FLOAT, []),
                    helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])], [data])
    art = relaxc.compile(model, tuning="off", backend_overrides={"*": "onnxruntime"})
    bad = {"m": np.eye(2, dtype=np.float32), "i": np.full((4, 3), 99, np.int64)}
    with pytest.raises(relaxc.InputError, match="onnxruntime subgraph refused its input"):
        art.run(bad)


def test_the_shortest_path_picks_each_segments_cheapest_backend_with_crossings():
    parts = [[0, 1], [2], [3, 4]]
    costs = [{"relaxc": 1.0, "onnxruntime": 2.0}, {"relaxc": 5.0, "onnxruntime": 1.0},
             {"relaxc": 1.0, "onnxruntime": 1.005}]
    assert backend_costs._shortest(parts, costs) == [(0, 2, "relaxc"), (2, 3, "onnxruntime"),
                                                      (3, 5, "onnxruntime")]


def test_segments_cut_where_fewest_values_cross():
    from relaxc import frontend

    prepared = frontend.prepare_model(reference.small_cnn())
    parts = partition.segments(prepared.proto, 3)
    assert [i for p in parts for i in p] == list(range(len(prepared.proto.graph.node)))
    assert 1 < len(parts) <= 3


def _fastest(name: str):
    """A stand-in for ``backend_candidates.compare``: ``name`` times 1 ms, every other runner 2, no tie."""
    return lambda runners, inputs, repeat=20: ({other: (1.0 if other == name else 2.0) for other in runners}, [])


@pytest.fixture
def two_segments(monkeypatch):
    """Measurements cut the graph in two segments: what is checked here is the decision and its
    replay, not the segments (``_shortest`` and ``segments`` are tested alone)."""
    monkeypatch.setattr(backend_costs, "SEGMENTS", 2)


@pytest.mark.usefixtures("two_segments")
def test_measured_choice_is_stored_and_replayed(tmp_path, monkeypatch):
    """The decision of a measurement that finds onnxruntime fastest (times replaced here: which
    backend is faster is the machine's to say) compiles the model onto it and is replayed from
    the store without measuring again."""
    measured = {}

    def compare(runners, inputs, repeat=20):
        measured.update({name: runner for name, runner in runners.items()})
        return {name: (1.0 if name == "onnxruntime" else 2.0) for name in runners}, []

    monkeypatch.setattr(backend_candidates, "compare", compare)
    model = reference.small_cnn()
    start = time.perf_counter()
    art = relaxc.compile(model, tuning="off", backends="measure", cache_dir=str(tmp_path), measure_budget_s=5)
    wall = time.perf_counter() - start
    assert {"relaxc", "onnxruntime"} <= set(measured)
    # the measurement is a phase of its own: every second of the compile is in one
    assert sum(phase["seconds"] for phase in art.report()["phases"]) == pytest.approx(wall, rel=0.05)
    assert next(p for p in art.report()["phases"] if p["name"] == "backends")["seconds"] > wall / 2
    backends = art.report()["backends"]
    assert backends["decision"] == "onnxruntime"
    assert [s["backend"] for s in backends["subgraphs"]] == ["onnxruntime"]
    _matches(art, model)

    monkeypatch.setattr(backend_costs, "measure", lambda *a, **k: pytest.fail("measured again"))
    replayed = relaxc.compile(model, tuning="off", cache_dir=str(tmp_path))
    assert replayed.report()["backends"]["decision"] == "onnxruntime"
    assert relaxc.compile(model, tuning="off", cache_dir=str(tmp_path), backends="rule") \
        .report()["backends"]["subgraphs"] == []


REPLAY_AND_LIST_LIBRARIES = """
import sys, relaxc
art = relaxc.compile(sys.argv[1], tuning="off", cache_dir=sys.argv[2])
print(art.report()["backends"]["decision"], sorted({"onnxruntime", "openvino"} & set(sys.modules)))
"""


@pytest.mark.usefixtures("two_segments")
def test_a_replayed_decision_for_relaxc_imports_no_library(tmp_path, monkeypatch):
    """Replaying a stored decision for relaxc's kernels compiles as ``backends="off"`` does:
    the libraries' versions come from their metadata, not from importing them (0.23 s)."""
    monkeypatch.setattr(backend_candidates, "compare", _fastest("relaxc"))
    model = reference.small_cnn()
    relaxc.compile(model, tuning="off", backends="measure", cache_dir=str(tmp_path), measure_budget_s=5)
    with open(tmp_path / "model.onnx", "wb") as f:
        f.write(model.SerializeToString())
    proc = subprocess.run([sys.executable, "-c", REPLAY_AND_LIST_LIBRARIES, str(tmp_path / "model.onnx"),
                           str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "relaxc []", proc.stdout


def test_a_backends_version_is_its_distributions_as_the_library_reports_it():
    for name in external.installed():
        backend = external.get(name)
        assert backend.library().__version__.startswith(backend.version())


@pytest.mark.usefixtures("two_segments")
def test_a_stored_choice_of_a_missing_backend_falls_back_to_the_best_installed(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(backend_candidates, "compare", _fastest("onnxruntime"))
    model = reference.small_cnn()
    relaxc.compile(model, tuning="off", backends="measure", cache_dir=str(tmp_path), measure_budget_s=5)
    installed = external.installed()
    monkeypatch.setattr(external, "installed", lambda: [n for n in installed if n != "onnxruntime"])
    art = relaxc.compile(model, tuning="off", cache_dir=str(tmp_path))
    assert "onnxruntime" not in [s["backend"] for s in art.report()["backends"]["subgraphs"]]
    assert "not installed" in caplog.text


@pytest.mark.usefixtures("two_segments")
def test_segments_past_the_budget_stay_on_relaxc_and_show_no_time(tmp_path, monkeypatch):
    monkeypatch.setattr(backend_candidates, "compare", _fastest("relaxc"))
    art = relaxc.compile(reference.small_cnn(), tuning="off", backends="measure", cache_dir=str(tmp_path),
                           measure_budget_s=1e-6)
    backends = art.report()["backends"]
    assert backends["unmeasured_segments"] == len(backends["segments"]) == 2
    assert all(segment["ms"] == {} for segment in backends["segments"]) and backends["segment_sums"] == {}
    assert plan_summary(backends).count("alone (ms): not measured (budget)") == 2


@pytest.mark.usefixtures("two_segments")
def test_a_candidate_that_fails_to_build_is_dropped_with_its_reason(tmp_path, monkeypatch):
    """TVM failing on one candidate's partition (an assertion deep in a pass) ends that candidate,
    named in the report, not the compile."""
    pytest.importorskip("openvino")
    artifact = pipeline._artifact

    def failing_on_openvino(compilation, *args, **kwargs):
        if set(compilation.partitioning.chosen.values()) == {"openvino"}:
            raise AssertionError("emit_te now only supports Tensor that has ShapeExpr shape")
        return artifact(compilation, *args, **kwargs)

    monkeypatch.setattr(pipeline, "_artifact", failing_on_openvino)
    monkeypatch.setattr(backend_candidates, "compare", _fastest("relaxc"))
    art = relaxc.compile(reference.small_cnn(), tuning="off", backends="measure", cache_dir=str(tmp_path),
                           measure_budget_s=5)
    rejected = art.report()["backends"]["rejected"]
    assert rejected["openvino"] == "not built: AssertionError: emit_te now only supports Tensor that has " \
        "ShapeExpr shape"
    assert "onnxruntime" not in rejected and art.report()["backends"]["decision"] == "relaxc"


def test_the_strategy_picks_the_fastest_or_the_smallest_candidate():
    entry = {"ms": {"relaxc": 2.0, "onnxruntime": 1.0, "openvino": 1.5},
             "memory": {"relaxc": 100 << 20, "onnxruntime": 200 << 20, "openvino": 104 << 20}}
    assert backend_choice.decide(entry, "latency") == "onnxruntime"
    assert backend_choice.decide(entry, "memory") == "openvino"  # within 5 % of relaxc's, and faster
    assert backend_choice.decide(entry, "memory", {"relaxc", "onnxruntime"}) == "relaxc"


@pytest.mark.usefixtures("two_segments")
def test_each_strategy_is_measured_and_replayed_on_its_own(tmp_path, monkeypatch):
    """relaxc fastest, onnxruntime smallest (both replaced here: which is which is the machine's to
    say): ``memory`` picks onnxruntime and replays it unmeasured; ``latency`` has a measurement of
    its own (relaxc's convolutions are other builds under each)."""
    monkeypatch.setattr(backend_candidates, "compare", _fastest("relaxc"))
    monkeypatch.setattr(backend_candidates.Built, "released", lambda self:
                        {name: (1 if name == "onnxruntime" else 50) << 20 for name in self.runners})
    model = reference.small_cnn()
    options = dict(tuning="off", cache_dir=str(tmp_path), measure_budget_s=5)
    small = relaxc.compile(model, backends="measure", strategy="memory", **options)
    assert small.report()["backends"]["decision"] == "onnxruntime"
    assert small.report()["backends"]["measured_memory_bytes"]["onnxruntime"] == 1 << 20
    assert "(strategy memory)" in plan_summary(small.report()["backends"])
    assert [s["why"] for s in small.report()["backends"]["subgraphs"]] == ["measured smaller"]
    assert "none stored" in relaxc.compile(model, **options).report()["backends"]["decision"]
    assert relaxc.compile(model, backends="measure", **options).report()["backends"]["decision"] == "relaxc"
    monkeypatch.setattr(backend_costs, "measure", lambda *a, **k: pytest.fail("measured again"))
    assert relaxc.compile(model, strategy="memory", **options).report()["backends"]["decision"] == "onnxruntime"


def test_a_candidates_memory_is_what_freeing_it_gives_back():
    """64 MiB a candidate holds in 1 KiB pieces count (freed small blocks stay in the heap unless
    handed back to the OS), and what one was built with and dropped does not."""
    class Holding:
        def __init__(self, pieces):
            self.held = [np.ones(256, np.float32) for _ in range(pieces)]

        def run(self, inputs):
            return []

    built = backend_candidates.Built({})
    built.add("holds", lambda prepared, pieces: Holding(pieces), None, 64 << 10)
    built.add("light", lambda prepared, pieces: Holding(pieces), None, 0)
    garbage = [np.ones(256, np.float32) for _ in range(64 << 10)]
    del garbage
    memory = built.released()
    assert (48 << 20) <= memory["holds"] < (96 << 20) and memory["light"] < (8 << 20)
    assert built.runners == {}


def test_inspect_plan_prints_the_subgraphs(tmp_path):
    from tests.helpers import run_cli

    path = tmp_path / "det.onnx"
    path.write_bytes(_det_between_convs().SerializeToString())
    proc = run_cli("inspect", str(path), "--plan", "--tuning", "off", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "1 external subgraph(s)" in proc.stdout and "onnxruntime call" in proc.stdout and "1 Det" in proc.stdout
    proc = run_cli("inspect", str(path), "--backends", "off", "--tuning", "off", "-q")
    assert proc.returncode == 2 and "Det" in proc.stderr


@pytest.mark.slow
def test_a_detector_ending_in_non_max_suppression_compiles_exports_and_matches(tmp_path):
    """torchvision's SSDlite with its post-processing (zoo light form, random weights): relaxc runs
    the backbone and heads, onnxruntime the tail from the first data-dependent shape on. With random
    weights the detections barely depend on the image, so the heads' outputs (the tail's inputs,
    which do) are compared too."""
    import onnx
    from relaxc import frontend
    from relaxc.frontend import exactness, models

    spec = "zoo:ssdlite320_mobilenet_v3_large"
    art = relaxc.compile(spec, tuning="off", backends="replay")
    (tail,) = art.report()["backends"]["subgraphs"]
    assert tail["placement"] == "tail" and tail["ops"]["NonMaxSuppression"] == 1
    proto = models.fill_light(onnx.load(models.bundled_path(spec)))
    image = {"image": np.random.default_rng(0).random((1, 3, 320, 320), dtype=np.float32)}
    outputs = art.run(image)
    reference.assert_matches(outputs, reference.ort_run(proto, image))

    values = art.program_values(image)
    prepared = frontend.prepare_model(spec)
    facts = exactness.Facts(prepared.proto, prepared.inputs, list(prepared.proto.graph.node))
    probe = partition.with_outputs(prepared.proto, facts, list(values))
    expected = dict(zip([v.name for v in probe.graph.output], reference.ort_run(probe, image)))
    assert any(np.std(v) > 1e-3 for v in values.values())
    reference.assert_matches(list(values.values()), [expected[name] for name in values])

    art.export(str(tmp_path / "ssd.so"))
    loaded = relaxc.load(str(tmp_path / "ssd.so"))
    for got, want in zip(loaded.run(image), outputs):
        np.testing.assert_array_equal(got, want)


@pytest.mark.usefixtures("two_segments")
def test_a_library_may_run_the_model_as_exported(tmp_path, monkeypatch):
    """The whole model on a library is measured both as relaxc prepared it and as exported; the
    export chosen (times replaced here) is what the library runs, and what replays."""
    monkeypatch.setattr(backend_candidates, "compare", _fastest("onnxruntime@export"))
    model = reference.small_cnn()
    art = relaxc.compile(model, tuning="off", backends="measure", cache_dir=str(tmp_path), measure_budget_s=5)
    assert art.report()["backends"]["decision"] == "onnxruntime@export"
    (sub,) = art.subgraphs
    assert sub.alone and sub.model == model.SerializeToString()
    _matches(art, model)
    replayed = relaxc.compile(model, tuning="off", cache_dir=str(tmp_path))
    assert replayed.subgraphs[0].model == sub.model


def test_a_dynamic_model_is_measured_whole_at_two_sizes(tmp_path, monkeypatch):
    """Dims dynamic up to 16: every candidate timed whole (no segments) at batch 4 and 1, a quarter
    and a sixteenth of the bound (times replaced: relaxc fastest at 1, onnxruntime as exported at
    4 and by the geometric mean), so relaxc's program runs batch 1 and onnxruntime from batch 2 (the
    geometric mean of 1 and 4); the artifact runs any size within the bound, refuses one past it
    as relaxc's own does, exports, loads and replays with the same split."""
    timed = []

    def compare(runners, inputs, repeat=20):
        batch = inputs["x"].shape[0]
        timed.append(batch)
        ms = {"relaxc": 2.0, "onnxruntime@export": 1.0} if batch == 4 else {"relaxc": 1.0, "onnxruntime@export": 1.5}
        return {name: ms.get(name, 3.0) for name in runners}, []

    monkeypatch.setattr(backend_candidates, "compare", compare)
    model = reference.small_cnn()
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    options = dict(tuning="off", cache_dir=str(tmp_path), dim_bounds={"batch": 16})
    art = relaxc.compile(model, backends="measure", measure_budget_s=5, **options)
    backends = art.report()["backends"]
    assert timed == [4, 1] and backends["segments"] == []
    assert set(backends["measured_ms_by_size"]) == {"batch 4", "batch 1"}
    assert backends["measured_ms"]["relaxc"] == pytest.approx(2 ** 0.5, abs=1e-3)
    assert backends["decision"] == "relaxc"
    assert backends["decision_by_size"] == {"batch 4": "onnxruntime@export", "batch 1": "relaxc"}
    (sub,) = backends["subgraphs"]
    assert (sub["backend"], sub["placement"], sub["serves"]) == ("onnxruntime", "sizes", [2, 17])
    assert art.subgraphs[0].model == model.SerializeToString()  # as exported
    for batch in (1, 2, 3, 16):
        inputs = reference.random_inputs(art.inputs, seed=batch, dims={"batch": batch})
        assert (art.serving(inputs) is None) == (batch == 1)
        reference.assert_matches(art.run(inputs), reference.ort_run(model, inputs))
    with pytest.raises(relaxc.InputError, match=r"dim 0 \('batch'\) is 17, outside its bound 1..16"):
        art.run(reference.random_inputs(art.inputs, dims={"batch": 17}))
    at = [reference.random_inputs(art.inputs, seed=k, dims={"batch": 1 + k % 2 * 2}) for k in range(8)]
    alone = [art.run(inputs)[0] for inputs in at]
    with ThreadPoolExecutor(8) as pool:  # program and library at once, from threads
        for _ in range(10):
            for got, want in zip(pool.map(lambda inputs: art.run(inputs)[0], at), alone):
                np.testing.assert_array_equal(got, want)
    assert "at batch 4" in plan_summary(backends) and "product is 2..16" in plan_summary(backends)
    assert [(k.schedule, k.kind) for k in profile.profile(art, at[1]).kernels] == [("onnxruntime", "external")]
    assert all(k.kind != "external" for k in profile.profile(art, at[0]).kernels)
    art.export(str(tmp_path / "model.so"))
    loaded = relaxc.load(str(tmp_path / "model.so"))
    for batch in (1, 5):
        inputs = reference.random_inputs(art.inputs, dims={"batch": batch})
        assert (loaded.serving(inputs) is None) == (batch == 1)
        np.testing.assert_array_equal(loaded.run(inputs)[0], art.run(inputs)[0])
    strategy = relaxc.compile(model, strategy="memory", backends="measure", measure_budget_s=5, **options)
    assert "decision_by_size" not in strategy.report()["backends"]  # one build held: never split
    monkeypatch.setattr(backend_costs, "measure", lambda *a, **k: pytest.fail("measured again"))
    replayed = relaxc.compile(model, **options).report()["backends"]
    assert replayed["decision_by_size"] == backends["decision_by_size"]


def test_sizes_split_only_where_another_backend_is_faster_by_more_than_split():
    """Per size the fastest candidate, unless the fastest overall is within SPLIT of it there;
    adjacent sizes of one candidate merge, boundaries at the geometric mean of their work."""
    bounds = {"batch": 4, "sequence": 96}  # timed at 1x24 (work 24) and 1x6 (work 6)
    entry = {"ms": {"relaxc": 1.0, "openvino": 1.1},
             "ms_by_size": {"batch 1, sequence 24": {"relaxc": 2.0, "openvino": 1.5},
                            "batch 1, sequence 6": {"relaxc": 0.5, "openvino": 0.8}}}
    assert backend_choice.by_size(entry, bounds, {"relaxc", "openvino"}) == \
        [("relaxc", 1, 12), ("openvino", 12, 4 * 96 + 1)]
    entry["ms_by_size"]["batch 1, sequence 24"]["openvino"] = 2.0 / backend_choice.SPLIT * 1.001
    assert backend_choice.by_size(entry, bounds, {"relaxc", "openvino"}) == [("relaxc", 1, 4 * 96 + 1)]
    assert backend_choice.by_size(entry, bounds, {"openvino"}) == [("openvino", 1, 4 * 96 + 1)]


def test_an_operator_relaxc_cannot_import_in_a_dynamic_model_runs_in_the_tail():
    """With dynamic dims nothing after an external node has a static shape: it and the rest of
    the model run after relaxc's program, at every size within the bound."""
    model = _det_between_convs()
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    art = relaxc.compile(model, tuning="off", dim_bounds={"batch": 8})
    assert [(s["placement"], s["ops"]) for s in art.report()["backends"]["subgraphs"]] == \
        [("tail", {"Det": 1, "Add": 1})]
    for batch in (1, 5, 8):
        inputs = reference.random_inputs(art.inputs, seed=batch, dims={"batch": batch})
        reference.assert_matches(art.run(inputs), reference.ort_run(model, inputs))


def test_a_candidate_answering_otherwise_than_relaxc_is_no_candidate():
    """Outputs compared with the first candidate's (relaxc's) within the project's tolerance: a
    value off, or another shape (a detector keeping another number of boxes), rejects it."""
    class Answers:
        def __init__(self, output):
            self.output = output

        def run(self, inputs):
            return [self.output]

    built = backend_candidates.Built({})
    for name, output in {"relaxc": np.ones(4), "close": np.ones(4) + 1e-6, "off": np.array([1.0, 1.0, 1.0, 1.01]),
                         "shape": np.ones(3)}.items():
        built.add(name, lambda prepared, given: Answers(given), None, output)
    assert set(built.rejected) == {"off", "shape"} and set(built.runners) == {"relaxc", "close"}
    assert built.rejected["off"] == "its output 0 differs from relaxc's"


def test_paired_times_cancel_slow_rounds_and_a_burst_in_one_block(monkeypatch):
    """Block medians by round: three rounds slower for both, one block of b's slowed alone; b's
    time keeps its ratio to a in each round, 2x."""
    blocks = {"a": iter([1.0, 1.0, 1.5, 1.5, 1.5, 1.0]), "b": iter([2.0, 9.0, 3.0, 3.0, 3.0, 2.0])}
    monkeypatch.setattr(turns, "block", lambda fn, count: [fn()])
    ms = turns.paired({name: (lambda name=name: next(blocks[name])) for name in blocks}, repeat=6)
    assert ms == {"a": 1.25, "b": 2.5}


def test_each_round_of_blocks_starts_one_function_further_on(monkeypatch):
    """No function always follows the same one (whose threads may still be winding down)."""
    order = []
    monkeypatch.setattr(turns, "block", lambda fn, count: [fn()])
    turns.rounds_of_blocks({name: (lambda name=name: order.append(name)) for name in "abc"}, repeat=4, rounds=4)
    assert "".join(order) == "abcbcacababc"


def test_a_ratio_range_holds_the_middle_rounds_with_95_percent_confidence():
    """24 rounds: the 7th and 18th smallest of the ratios (a binomial's 2.3 % tail each side)."""
    ratios = [1.0 + k / 100 for k in range(24)]
    medians = {"measured": [2.0] * 24, "fastest": [2.0 * r for r in ratios[::-1]]}
    assert turns.ratio_range(medians, "fastest", "measured") == (ratios[6], ratios[17])
    assert turns.ratio_range({"a": [1.0], "b": [3.0]}, "b", "a") == (3.0, 3.0)  # one round: nothing to spread


def test_a_mixed_plan_tied_with_one_backend_yields_to_it():
    """The mix timed fastest but its rounds against OpenVINO's held 1: one runtime, no crossings,
    wins; not where the mix is faster for sure, and a tie between two single backends goes to the
    faster as timed."""
    entry = {"ms": {"plan": 77.7, "openvino": 78.7, "relaxc": 90.0}, "memory": {}, "tied": ["plan", "openvino"]}
    assert backend_choice.decide(entry, "latency") == "openvino"
    assert backend_choice.decide(entry | {"tied": []}, "latency") == "plan"
    assert backend_choice.decide(entry, "latency", {"plan", "relaxc"}) == "plan"
    assert backend_choice.decide(entry | {"tied": ["openvino", "relaxc"]}, "latency") == "plan"
    singles = {"ms": {"relaxc": 1.0, "openvino": 1.01}, "memory": {}, "tied": ["relaxc", "openvino"]}
    assert backend_choice.decide(singles, "latency") == "relaxc"


def test_compare_names_the_two_fastest_where_their_rounds_cannot_tell_them_apart(monkeypatch):
    """``_compare`` on stand-in runners whose blocks the rounds give: one 1.2x slower in every round
    is no tie; two whose ratio swings 0.9-1.1 about 1 are, after the extra rounds."""
    class Runner:
        def __init__(self, ms: float) -> None:
            self.ms = ms

        def run(self, inputs):
            return self.ms

    def rounds(runs, repeat, count):
        swing = [0.9, 1.1] * (count // 2)
        return {name: [run() * (s if name == "b" else 1.0) for s in swing] for name, run in runs.items()}

    monkeypatch.setattr(backend_candidates, "block", lambda call, runs: [call()] * runs)
    monkeypatch.setattr(backend_candidates, "paired", lambda runs, repeat: {name: call() for name, call in runs.items()})
    monkeypatch.setattr(backend_candidates, "round_medians", rounds)
    ms, tied = backend_candidates.compare({"a": Runner(1.0), "c": Runner(1.2)}, {})
    assert tied == [] and ms["c"] == pytest.approx(1.2)
    ms, tied = backend_candidates.compare({"a": Runner(1.0), "b": Runner(1.0), "c": Runner(1.2)}, {})
    assert sorted(tied) == ["a", "b"]


def test_two_runtimes_are_settled_when_one_is_faster_or_both_are_within_a_tie():
    """24 rounds of b against a: settled where the ratios' 95 % range lies above 1, or within
    ``TIE`` of 1 either way; not where it holds 1 and reaches past ``TIE``."""
    def rounds(ratios: list[float]) -> dict[str, list[float]]:
        return {"a": [2.0] * len(ratios), "b": [2.0 * r for r in ratios]}

    assert backend_candidates.settled(rounds([1.01 + k / 200 for k in range(24)]))  # b slower: 1.04-1.10
    assert backend_candidates.settled(rounds([0.99 + k / 1000 for k in range(24)]))  # a tie: 0.996-1.007
    assert not backend_candidates.settled(rounds([0.93 + k / 100 for k in range(24)]))  # 0.99-1.10: not yet


class _UnscheduledConvs(dl.ScheduleRule):
    """Test hook: the convolutions' kernels (direct, or Winograd's transforms and its batched GEMM,
    ``dense_packed``) left as TVM emits them without a schedule (serial loops, tens of times slower
    than onnxruntime's): relaxc loses by construction."""

    def apply(self, func, target, tunable):
        return s_tir.Schedule(func) if re.search(r'sblock\("\w*(conv|winograd|dense)', func.script()) else None

    def is_target_available(self, target):
        return True


def _conv_pair():
    rng = np.random.default_rng(1)
    weights = [numpy_helper.from_array((rng.standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32), f"w{i}")
               for i in range(2)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["y"], name="relu1")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 56, 56])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 56, 56])], weights)


@pytest.mark.usefixtures("two_segments")
@pytest.mark.timing
def test_measure_moves_what_relaxc_runs_slowly_to_the_library(tmp_path, monkeypatch):
    """Real timings: with relaxc's convolutions unscheduled, ``measure`` puts them on onnxruntime,
    and the model runs within 1.05x of onnxruntime alone: the median over 48 rounds of the ratio
    of the two blocks' medians in the round, as a shared VM moves blocks at random by up to 50 %."""
    monkeypatch.setattr(default, "RULES", (("unscheduled", _UnscheduledConvs), *default.RULES))
    monkeypatch.setattr(external, "installed", lambda: ["onnxruntime"])
    model = _conv_pair()
    art = relaxc.compile(model, tuning="off", backends="measure", cache_dir=str(tmp_path), measure_budget_s=60)
    backends = art.report()["backends"]
    assert backends["measured_ms"]["relaxc"] > 2 * min(backends["measured_ms"].values())
    assert {sub["backend"] for sub in backends["subgraphs"]} == {"onnxruntime"}
    assert sum(sub["ops"].get("Conv", 0) for sub in backends["subgraphs"]) == 2
    inputs, _ = _matches(art, model)
    session = reference.ort_session(model)
    ms = turns.paired({"onnxruntime": lambda: session.run(None, inputs), "measured": lambda: art.run(inputs)},
                      repeat=48 * 15, rounds=48)
    assert ms["measured"] <= 1.05 * ms["onnxruntime"], (ms, backends["decision"], backends["measured_ms"])
