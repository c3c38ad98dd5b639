"""Every index a model reads or writes at is checked in the compiled code: in range (negative ones
included) the answer is onnxruntime's; outside, the call raises InputError and never reads memory
it should not, as onnxruntime refuses such a call."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import relaxc
from relaxc import frontend
from relaxc.passes.check_indices import LABEL
from relaxc.schedules.tuning import tuning_tasks
from relaxc.support.errors import InputError, ModelError
from tests import reference

DATA = (6, 5, 4)


def _model(op: str, indices_shape: tuple, attrs: dict, indices_dtype=TensorProto.INT64,
           constant_indices: np.ndarray | None = None) -> onnx.ModelProto:
    """``op`` over a 6x5x4 float input with the indices as a graph input (or a constant)."""
    data = helper.make_tensor_value_info("data", TensorProto.FLOAT, DATA)
    inputs, inits = [data], []
    if constant_indices is None:
        inputs.append(helper.make_tensor_value_info("idx", indices_dtype, indices_shape))
    else:
        inits.append(numpy_helper.from_array(constant_indices, "idx"))
    names = ["data", "idx"]
    if op.startswith("Scatter"):
        updates_shape = indices_shape if op == "ScatterElements" else \
            indices_shape[:-1] + DATA[indices_shape[-1]:]
        inits.append(numpy_helper.from_array(np.arange(np.prod(updates_shape), dtype=np.float32)
                                             .reshape(updates_shape), "updates"))
        names.append("updates")
    node = helper.make_node(op, names, ["out"], name=f"my_{op.lower()}", **attrs)
    graph = helper.make_graph([node], op, inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


# (op, indices shape, attributes, valid range of every index)
CASES = [
    ("Gather", (3, 2), {"axis": 1}, 5),
    ("Gather", (7,), {"axis": 0}, 6),
    ("GatherElements", (6, 5, 2), {"axis": 2}, 4),
    ("GatherND", (3, 2), {}, None),  # coordinates into 6 x 5
    ("GatherND", (6, 2, 1), {"batch_dims": 1}, None),  # per batch, coordinates into 5
    ("ScatterElements", (2, 5, 4), {"axis": 0}, 6),
    ("ScatterND", (2, 1), {}, None),  # whole rows: distinct, so the answer does not depend on order
]


def _indices(op: str, shape: tuple, attrs: dict, extent: int | None, rng) -> np.ndarray:
    if op == "ScatterND":
        return rng.choice(np.arange(-6, 6), size=shape, replace=False)
    if op == "ScatterElements":  # distinct along the axis, for the same reason
        return np.stack([rng.permutation(np.arange(-6, 6))[:shape[0]] for _ in range(20)], -1).reshape(shape)
    if op == "GatherND":
        extents = DATA[attrs.get("batch_dims", 0):][:shape[-1]]
        return np.stack([rng.integers(-e, e, size=shape[:-1]) for e in extents], axis=-1)
    return rng.integers(-extent, extent, size=shape)


@pytest.mark.parametrize("op,shape,attrs,extent", CASES, ids=[f"{c[0]}-{len(c[1])}d" for c in CASES])
def test_indices_in_range_match_onnxruntime_and_outside_raise(op, shape, attrs, extent):
    model = _model(op, shape, attrs)
    art = relaxc.compile(model, tuning="off")
    assert art.report()["index_checks"] == {"checked": 1, "unchecked": []} and art.report()["schedules"][LABEL] == 1
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    data = rng.standard_normal(DATA).astype(np.float32)
    for _ in range(3):  # negative indices included
        idx = _indices(op, shape, attrs, extent, rng)
        np.testing.assert_allclose(art.run(data, idx)[0], session.run(None, {"data": data, "idx": idx})[0])
    for bad in (DATA[0] * 10, -1000, 2**40, -2**62):
        idx = _indices(op, shape, attrs, extent, rng)
        idx.flat[-1] = bad
        with pytest.raises(Exception):  # onnxruntime refuses the call too
            session.run(None, {"data": data, "idx": idx})
        with pytest.raises(InputError, match=f"my_{op.lower()}.*from input 'idx'.*outside the valid range"):
            art.run(data, idx)
    np.testing.assert_allclose(art.run(data, idx * 0)[0], session.run(None, {"data": data, "idx": idx * 0})[0])


def test_the_error_names_the_first_offending_value_and_its_position():
    art = relaxc.compile(_model("Gather", (3, 2), {"axis": 1}), tuning="off")
    idx = np.array([[0, 1], [4, 5], [-6, 9]])
    with pytest.raises(InputError) as err:
        art.run(np.zeros(DATA, np.float32), idx)
    assert str(err.value) == ("Gather 'my_gather' (indices from input 'idx'): an index is outside the valid "
                              "range [-5, 5): 5 at position [1, 1]")


def test_an_exported_artifact_checks_its_indices_too(tmp_path):
    relaxc.compile(_model("Gather", (7,), {"axis": 0}), tuning="off").export(tmp_path / "m.so")
    runner = relaxc.load(tmp_path / "m.so")
    data = np.ones(DATA, np.float32)
    with pytest.raises(InputError, match=r"valid range \[-6, 6\): 6 at position \[6\]"):
        runner.run(data, np.array([0, 1, 2, 3, 4, 5, 6]))
    assert runner.run(data, np.array([0, 1, 2, 3, 4, 5, -6]))[0].shape == (7, 5, 4)


def test_unsigned_and_int32_indices_are_checked_in_their_type():
    for dtype, np_dtype in ((TensorProto.INT32, np.int32), (TensorProto.UINT8, np.uint8)):
        art = relaxc.compile(_model("Gather", (4,), {"axis": 0}, dtype), tuning="off")
        data = np.arange(np.prod(DATA), dtype=np.float32).reshape(DATA)
        np.testing.assert_array_equal(art.run(data, np.array([5, 0, 1, 2], np_dtype))[0], data[[5, 0, 1, 2]])
        low = -6 if np_dtype == np.int32 else 0
        with pytest.raises(InputError, match=rf"valid range \[{low}, 6\): 200"):
            art.run(data, np.array([0, 200, 1, 2], np_dtype))


def test_indices_whose_type_cannot_leave_the_data_are_not_checked():
    art = relaxc.compile(_model("Gather", (4,), {"axis": 0}, TensorProto.UINT8), tuning="off")
    assert art.report()["index_checks"]["checked"] == 1  # 6 rows: uint8 can exceed them
    model = _model("Gather", (4,), {"axis": 0}, TensorProto.UINT8)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 256
    assert relaxc.compile(model, tuning="off").report()["index_checks"]["checked"] == 0


def test_constant_indices_are_checked_at_compile_time_and_cost_nothing():
    fine = relaxc.compile(_model("Gather", (3,), {"axis": 0}, constant_indices=np.array([0, -6, 5])), tuning="off")
    assert fine.report()["index_checks"]["checked"] == 0
    with pytest.raises(ModelError, match=r"Gather.*constant index 6 is outside the valid range \[-6, 6\)"):
        relaxc.compile(_model("Gather", (3,), {"axis": 0}, constant_indices=np.array([0, 6, 1])), tuning="off")


def test_gpu_targets_say_which_indices_they_do_not_check(caplog):
    with caplog.at_level("WARNING", logger="relaxc"):
        art = relaxc.compile(_model("Gather", (7,), {"axis": 0}), target="cuda", tuning="off")
    assert art.report()["index_checks"] == {"checked": 0, "unchecked": ["Gather 'my_gather'"]}
    assert "indices are not checked at run time on this GPU target" in caplog.text


def test_the_checks_are_no_tuning_tasks():
    art = relaxc.compile(_model("Gather", (7,), {"axis": 0}), tuning="off")
    names = [task.task_name for task in tuning_tasks(art.module("fuse"), art.target)]
    assert names and not any("check_indices" in name for name in names)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_transformers_refuse_token_ids_outside_the_vocabulary(name):
    art = relaxc.compile(f"zoo:{name}", tuning="off")
    vocab = art.input_high["input_ids"]
    inputs = reference.random_inputs(art.inputs, seed=0, high=art.input_high)
    for bad in (vocab, 1_000_000, -vocab - 1, -2**63):
        ids = inputs["input_ids"].copy()
        ids.flat[3] = bad
        with pytest.raises(InputError, match=rf"input 'input_ids'.*valid range \[-{vocab}, {vocab}\): {bad} at"):
            art.run({**inputs, "input_ids": ids})
    ids = inputs["input_ids"].copy()
    ids.flat[3] = -1  # the last token of the vocabulary, as onnxruntime reads it
    expected = reference.ort_run(frontend.load_model(f"zoo:{name}")[0], {**inputs, "input_ids": ids})
    reference.assert_matches(reference.relaxc_run(art, {**inputs, "input_ids": ids}), expected)
