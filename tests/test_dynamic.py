"""Models with dynamic dims compiled once, run at every size within their bounds."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm

import relaxc
from relaxc import cli, frontend
from tests import reference

BERT = "zoo:bert_dynamic"  # transformers' BERT exported with dynamic batch and sequence
BOUNDS = {"batch": 4, "sequence": 64}


def _dynamic_cnn() -> onnx.ModelProto:
    model = reference.small_cnn()
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    return model


@pytest.fixture(scope="module")
def bert() -> relaxc.Artifact:
    return relaxc.compile(BERT, tuning="off", backends="off", dim_bounds=BOUNDS)


def _bert_inputs(art: relaxc.Artifact, batch: int, sequence: int, seed: int = 0) -> dict[str, np.ndarray]:
    return reference.random_inputs(art.inputs, seed, art.input_high, {"batch": batch, "sequence": sequence})


def test_a_dynamic_transformer_matches_onnxruntime_at_every_size(bert):
    """One artifact, its dims kept by the model's names, sized by each call's inputs."""
    assert bert.inputs == [("input_ids", ("batch", "sequence"), "int64"),
                           ("attention_mask", ("batch", "sequence"), "int64")]
    assert bert.outputs == [("last_hidden_state", ("batch", "sequence", 256), "float32")]
    assert bert.report()["dim_bounds"] == BOUNDS
    assert bert.report()["attention"] == {"padded_attentions": 4}  # keys to whole vectors, queries to tiles
    kernels = {gv.name_hint: f.script() for gv, f in bert.module("final").functions.items()
               if isinstance(f, tvm.tirx.PrimFunc)}
    assert not any(name.startswith("reshape") for name in kernels)  # views, not copies
    assert not any("dense_rows_pad" in text for text in kernels.values())  # padding rows read the last one again
    session = reference.ort_session(frontend.load_model(BERT)[0])
    for batch, sequence in ((1, 16), (2, 7), (4, 64), (3, 1)):
        inputs = _bert_inputs(bert, batch, sequence)
        (got,) = bert.run(inputs)
        assert got.shape == (batch, sequence, 256)
        reference.assert_matches([got], session.run(None, inputs))


def test_memory_is_planned_once_for_the_bounds(bert):
    memory = bert.report()["memory"]
    assert memory["dynamic_allocations"] == 0 and memory["arena_bytes"] >= memory["lower_bound_bytes"] > 0
    hidden = BOUNDS["batch"] * BOUNDS["sequence"] * 256 * 4  # one activation at the bounds
    assert memory["lower_bound_bytes"] >= hidden


@pytest.mark.parametrize("sizes, message", [
    ({"batch": 5, "sequence": 8}, r"input 'input_ids' dim 0 \('batch'\) is 5, outside its bound 1\.\.4"),
    ({"batch": 1, "sequence": 65}, r"dim 1 \('sequence'\) is 65, outside its bound 1\.\.64"),
])
def test_a_size_outside_its_bound_is_refused(bert, sizes, message):
    with pytest.raises(relaxc.InputError, match=message):
        bert.run(_bert_inputs(bert, sizes["batch"], sizes["sequence"]))


def test_inputs_sharing_a_dim_must_agree(bert):
    inputs = _bert_inputs(bert, 2, 8)
    inputs["attention_mask"] = inputs["attention_mask"][:, :6]
    with pytest.raises(relaxc.InputError, match=r"input 'attention_mask' dim 1 \('sequence'\) is 6, but input "
                                                  r"'input_ids' has sequence 8"):
        bert.run(inputs)


def test_export_and_load_keep_the_dynamic_dims(bert, tmp_path):
    bert.export(tmp_path / "bert.so")
    loaded = relaxc.load(str(tmp_path / "bert.so"))
    assert loaded.inputs == bert.inputs and loaded.dim_bounds == BOUNDS
    for batch, sequence in ((1, 5), (3, 64)):
        inputs = _bert_inputs(bert, batch, sequence, seed=1)
        np.testing.assert_array_equal(loaded.run(inputs)[0], bert.run(inputs)[0])
    with pytest.raises(relaxc.InputError, match="outside its bound"):
        loaded.run(_bert_inputs(bert, 1, 70))


@pytest.mark.parametrize("name, bounds, sizes", [
    ("distilbert_dynamic", {"batch": 2, "sequence": 64}, [{"batch": 2, "sequence": 9}, {"batch": 1, "sequence": 64}]),
    ("t5_encoder_dynamic", {"batch": 2, "sequence": 64}, [{"batch": 2, "sequence": 9}, {"batch": 1, "sequence": 64}]),
    ("qwen2_dynamic", {"batch": 2, "sequence": 64}, [{"batch": 2, "sequence": 9}, {"batch": 1, "sequence": 64}]),
    ("whisper_encoder_dynamic", {"batch": 2}, [{"batch": 1}, {"batch": 2}]),
])
def test_more_families_with_dynamic_dims_match_onnxruntime(name, bounds, sizes):
    """T5's relative position buckets, Qwen2's grouped-query attention, Whisper's 1-D convolutions
    and DistilBERT from the TorchScript exporter, each compiled once with its dims dynamic."""
    art = relaxc.compile(f"zoo:{name}", tuning="off", backends="off", dim_bounds=bounds)
    assert all(set(bounds) & set(shape) for _, shape, _ in art.inputs)
    session = reference.ort_session(frontend.load_model(f"zoo:{name}")[0])
    for seed, size in enumerate(sizes):
        inputs = reference.random_inputs(art.inputs, seed, art.input_high, size)
        reference.assert_matches(reference.relaxc_run(art, inputs), session.run(None, inputs))


def test_a_cnn_with_a_dynamic_batch():
    model = _dynamic_cnn()
    art = relaxc.compile(model, tuning="off", dim_bounds={"batch": 8})
    assert art.inputs == [("x", ("batch", 3, 32, 32), "float32")] and art.outputs == [("y", ("batch", 10), "float32")]
    for batch in (1, 3, 8):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 32, 32)).astype(np.float32)
        reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, {"x": x}))
    assert relaxc.compile(model, tuning="off", dim_bounds={"batch": 4}).fingerprint != art.fingerprint  # the bounds


@pytest.mark.parametrize("candidate", ["winograd2", "winograd4"])
def test_winograd_takes_a_dynamic_batch(candidate):
    """Each 3x3 convolution of a dynamic batch dispatched as batch 1 is, its tiles' rows an
    expression of the batch."""
    from relaxc.schedules.dispatch import forcing

    model = _dynamic_cnn()
    keys = [c["workload"] for c in relaxc.compile(model, tuning="off", dim_bounds={"batch": 8},
                                                    dispatch="rule").report()["dispatch"]["convolutions"]]
    assert keys and all("-1x" in key for key in keys)  # the workload at batch 1
    with forcing({key: candidate for key in keys}):
        art = relaxc.compile(model, tuning="off", dim_bounds={"batch": 8}, dispatch="rule")
    assert art.report()["dispatch"]["choices"] == {candidate: len(keys)}
    assert art.report()["schedules"].get("winograd")
    for batch in (1, 3, 8):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 32, 32)).astype(np.float32)
        reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(model, {"x": x}))


@pytest.mark.parametrize("bounds, message", [
    (None, r"dynamic dimension 0 \('batch'\); give it an upper bound with dim_bounds=\{'batch': N\} "
           r"\(--dim-bound batch=N\)"),
    ({"batch": 8, "sequence": 16}, r"dim_bounds names dim\(s\) \['sequence'\] that no dynamic input dim has; "
                                   r"the model's are \['batch'\]"),
    ({"batch": 0}, r"dim_bounds\['batch'\] must be a whole number of at least 1, got 0"),
])
def test_bad_bounds_are_refused_before_any_work(bounds, message):
    with pytest.raises(relaxc.ShapeError, match=message):
        relaxc.compile(_dynamic_cnn(), tuning="off", dim_bounds=bounds)


def test_a_dim_without_a_name_must_be_bound_by_shapes():
    model = _dynamic_cnn()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = ""
    with pytest.raises(relaxc.ShapeError, match=r"dynamic dimension 0 \(unnamed\); bind it with shapes="):
        relaxc.compile(model, tuning="off", dim_bounds={"batch": 8})


def test_the_command_line_bounds_dims_and_sizes_the_random_inputs(tmp_path, capsys):
    path = str(tmp_path / "cnn.onnx")
    onnx.save(_dynamic_cnn(), path)
    assert cli.main(["run", path, "-q", "--tuning", "off", "--dim-bound", "batch=8", "--dim", "batch=3"]) == 0
    assert "output y: shape (3, 10)" in capsys.readouterr().out
    assert cli.main(["run", path, "-q", "--tuning", "off", "--dim-bound", "batch=8", "--dim", "seq=3"]) == 2
    assert "--dim names dim(s) ['seq']" in capsys.readouterr().err


def test_combinations_that_do_not_work_yet_are_refused():
    with pytest.raises(relaxc.UserError, match="backend_overrides do not apply to a model with dynamic dims yet"):
        relaxc.compile(_dynamic_cnn(), tuning="off", dim_bounds={"batch": 8}, backend_overrides={"*": "onnxruntime"})
    from relaxc.benchmarks.quantized import quantize

    pytest.importorskip("onnxruntime.quantization")
    quantized = quantize(reference.small_cnn())
    quantized.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    with pytest.raises(relaxc.ShapeError, match=r"quantized models \(DequantizeLinear, QuantizeLinear\) with "
                                                  r"dynamic dims are not supported yet"):
        relaxc.compile(quantized, tuning="off", dim_bounds={"batch": 8})
