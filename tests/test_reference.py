"""The comparison helpers fail a model that relaxc did not run: with TVM's importer refusing every
graph, a model that went whole to onnxruntime must not pass as relaxc's result."""

import pytest

import relaxc
from tests import reference


def test_the_suites_default_fails_the_compile(importer_refusing_every_graph):
    with pytest.raises(relaxc.UserError, match="refused on purpose"):
        relaxc.compile(reference.small_cnn(), tuning="off")


def test_a_model_run_by_onnxruntime_fails_the_comparison(importer_refusing_every_graph):
    art = relaxc.compile(reference.small_cnn(), tuning="off", backends="replay")  # falls back whole
    assert art.report()["backends"]["whole_model_because"]
    inputs = reference.random_inputs(art.inputs)
    expected = reference.ort_run(reference.small_cnn(), inputs)
    reference.assert_matches(art.run(inputs), expected)  # onnxruntime matches itself ...
    with pytest.raises(AssertionError, match="onnxruntime ran 13 node"):
        reference.relaxc_run(art, inputs)  # ... and the helper says so


def test_the_helper_passes_relaxcs_own_run():
    art = relaxc.compile(reference.small_cnn(), tuning="off")
    inputs = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(reference.small_cnn(), inputs))
