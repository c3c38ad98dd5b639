"""Every bundled architecture, and random-weight models, match onnxruntime."""

import re

import onnx
import pytest

import relaxc
from relaxc.frontend import models
from tests import reference


@pytest.mark.slow
@pytest.mark.parametrize("name", models.BUNDLED)
def test_bundled_model_matches_onnxruntime(name):
    """With the arena planner validating: placement checked, arena filled with garbage each run."""
    spec = f"onnx:{name}"
    art = relaxc.compile(spec, target="cpu", validate_memory=True)
    inputs = reference.random_inputs(art.inputs)
    expected = reference.ort_run(onnx.load(models.bundled_path(spec)), inputs)
    reference.assert_matches(reference.relaxc_run(art, inputs), expected)
    reference.assert_matches(reference.relaxc_run(art, inputs), expected)
    memory = art.report()["memory"]
    assert memory["arena_bytes"] <= 1.05 * memory["lower_bound_bytes"]
    assert memory["arena_bytes"] <= memory["tvm_static_plan_bytes"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "squeezenet", "inception_v1", "shufflenet"])
def test_bundled_architecture_with_random_weights(name):
    model = reference.randomize_weights(onnx.load(models.bundled_path(f"onnx:{name}")), seed=7)
    art = relaxc.compile(model, target="cpu")
    inputs = reference.random_inputs(art.inputs, seed=3)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(model, inputs))


@pytest.mark.parametrize("build", [reference.small_cnn, reference.branchy_cnn])
def test_small_random_weight_models(build):
    model = build()
    art = relaxc.compile(model, target="cpu")
    inputs = reference.random_inputs(art.inputs, seed=5)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(model, inputs))


def test_dynamic_batch_bound_by_shapes():
    model = reference.small_cnn()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    art = relaxc.compile(model, shapes={"x": (4, 3, 32, 32)})
    assert art.inputs == [("x", (4, 3, 32, 32), "float32")]
    inputs = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(model, inputs))


def test_report_and_ir_per_phase():
    art = relaxc.compile(reference.small_cnn())
    report = art.report()
    assert report["model"] == "test"
    assert report["target"]["kind"] == "llvm"
    assert [p["name"] for p in report["phases"]] == ["startup", "prepare", "backends", "import", "simplify", "layout", "dispatch",
                                                     "legalize", "fuse", "tune", "schedule", "lower", "build", "report", "load"]
    assert report["layout"]["block"] in (8, 16) and report["layout"]["why"] == "the target's fp32 vector lanes"
    assert report["layout"]["blocked_ops"] > 0
    assert {p["from"] for p in report["layout"]["padded_tensors"]} == {20}  # the 3-channel input: unpadded
    assert all(p["seconds"] >= 0 for p in report["phases"])
    assert report["ops"]["Conv"] == 3 and report["ops"]["BatchNormalization"] == 1
    assert report["schedules"].get("none", 0) == 0 and report["schedules"]["tiled"] >= 4
    assert "R.nn.batch_norm" in art.ir("import")
    # simplify folds the batch norm that follows a conv into the conv's weights
    assert "batch_norm" not in art.ir("simplify")
    # each phase's snapshot is what that phase produced, untouched by later phases
    assert not re.search(r"NCHW\d+c", art.ir("simplify")) and re.search(r"NCHW\d+c", art.ir("layout"))
    assert "tirx.is_scheduled" not in art.ir("fuse") and "tirx.is_scheduled" in art.ir("schedule")
    assert "T.prim_func" in art.ir("legalize")
    with pytest.raises(relaxc.UserError, match="unknown phase 'nope'"):
        art.ir("nope")
