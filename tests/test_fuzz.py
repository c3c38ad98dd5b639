"""Differential fuzzing: the CI slice, every kept reproducer, and the fuzzer's own parts."""

import glob
import json
import os
import time

import onnx
import pytest

from tests.fuzz.__main__ import fuzz
from tests.fuzz.check import Outcome, assert_rounding_explains, check, check_in, inputs_for, out_of_range, worker
from tests.fuzz.generate import OPERATORS, random_graph
from tests.fuzz.shrink import shrink
from tests.isolated import HUNG, Isolated

CASES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "fuzz_cases", "*.onnx")))
CI_SEED, CI_GRAPHS = 20261123, 36
QUANTIZED_GRAPHS = 12


def test_ci_slice_has_no_failure(tmp_path):
    summary = fuzz(CI_GRAPHS, CI_SEED, str(tmp_path), progress=False)
    assert summary["failures"] == [], summary["failures"]
    assert summary["counts"]["reference"] == 0  # every generated graph is one onnxruntime runs
    assert summary["counts"]["pass"] >= CI_GRAPHS * 0.8, summary["counts"]


@pytest.mark.parametrize("form, graphs", [("QDQ", QUANTIZED_GRAPHS), ("QOperator", QUANTIZED_GRAPHS // 3)])
def test_quantized_ci_slice_has_no_failure(tmp_path, form, graphs):
    """Random graphs quantized by onnxruntime's tool (QDQ or QOperator): convolutions, matmuls,
    additions, concatenations and pooling between Q/DQ pairs, equal to onnxruntime's int8 as
    documented."""
    pytest.importorskip("onnxruntime.quantization", reason="onnxruntime's quantization tool makes the QDQ graphs")
    summary = fuzz(graphs, CI_SEED, str(tmp_path), progress=False, quantized=form)
    assert summary["failures"] == [], summary["failures"]
    assert summary["counts"]["pass"] == graphs, summary["counts"]


@pytest.fixture(scope="module")
def isolated():
    process = worker()
    yield process
    process.close()


@pytest.mark.parametrize("path", CASES, ids=[os.path.basename(p) for p in CASES])
def test_kept_reproducer(path, isolated):
    model = onnx.load(path)
    meta = json.loads(model.doc_string)
    outcome = check_in(isolated, model)  # a graph that hung once could take the machine's memory
    if meta["expect"] == "refused":  # by relaxc's own kernels; as users compile, onnxruntime may run it
        assert check_in(isolated, model, "relaxc").kind == "refused"
        assert outcome.kind in ("pass", "refused"), outcome
    else:
        assert outcome.kind == "pass", outcome


def test_relaxcs_quantized_values_explain_a_step_on_a_rounding_boundary_not_a_wrong_value():
    """Softplus one ulp from a rounding boundary, then QuantizeLinear: relaxc's value one step from
    onnxruntime's is explained by relaxc's quantized values; a value two steps off is not."""
    import relaxc

    model = onnx.load(os.path.join(os.path.dirname(__file__), "fuzz_cases", "mismatch-seed38000801.onnx"))
    inputs = inputs_for(model)
    (actual,) = relaxc.compile(model, tuning="off").run(inputs)
    assert_rounding_explains(model, inputs, [actual], None, "cpu", "found")
    wrong = actual.copy()
    wrong.flat[0] += 2
    with pytest.raises(AssertionError, match="given relaxc's quantized values"):
        assert_rounding_explains(model, inputs, [wrong], None, "cpu", "found")


def test_out_of_range_indices_are_refused_as_onnxruntime_refuses_them():
    """Gathers read indices from graph inputs; the check feeds valid ones (negative included) and
    out-of-range ones, which both runtimes must refuse."""
    own = tuple(name for name in OPERATORS if name != "external")  # relaxc's checks: none on onnxruntime
    graphs = (random_graph(seed, operators=own) for seed in range(100))
    model = next(m for m in graphs if out_of_range(m, inputs_for(m)))
    indices = [i.name for i in model.graph.input if i.name != "x"]
    assert any((inputs_for(model)[name] < 0).any() for name in indices)
    assert check(model).kind == "pass"


def _allocate(megabytes: int) -> str:
    try:
        return str(len(bytearray(megabytes << 20)))
    except MemoryError:
        return "MemoryError"


def test_a_worker_that_hangs_or_runs_out_of_memory_becomes_an_answer():
    slow = Isolated(time.sleep)
    assert slow.call(5, timeout=0.5)[1].startswith(HUNG)
    slow.close()
    small = Isolated(_allocate, memory=1 << 30)
    assert small.call(2048, timeout=60) == ("MemoryError", "")  # beyond the cap: refused, not swapped in
    assert small.call(64, timeout=60) == (str(64 << 20), "")  # the worker goes on
    small.close()


def test_generated_graphs_are_valid_onnx():
    for seed in range(200):
        model = random_graph(seed)
        onnx.shape_inference.infer_shapes(model, strict_mode=True, check_type=True)
        assert 2 <= len(model.graph.node) and len(model.graph.output) in (1, 2)


def test_shrink_finds_the_one_guilty_node():
    model = next(m for m in map(random_graph, range(100))
                 if len(m.graph.node) >= 6 and any(n.op_type == "Conv" for n in m.graph.node))
    guilty = lambda m: Outcome("mismatch" if any(n.op_type == "Conv" for n in m.graph.node) else "pass")  # noqa: E731
    small = shrink(model, Outcome("mismatch"), guilty)
    assert [n.op_type for n in small.graph.node] == ["Conv"]
    onnx.checker.check_model(small, full_check=True)
