import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The user's cache of this test session (its subprocesses too): empty, over the stores
# relaxc ships, never the user's own.
os.environ["RELAXC_CACHE_DIR"] = os.path.join(tempfile.mkdtemp(prefix="relaxc-test-cache-"), "records")
# What the tests compile runs on relaxc's kernels alone (subprocesses too): a model TVM's importer
# cannot take fails its test instead of running on onnxruntime and matching onnxruntime. A test of
# the external backends names its mode.
os.environ["RELAXC_BACKENDS"] = "relaxc"

import onnx  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """The small test CNN saved as a .onnx file, for command-line tests."""
    from tests import reference

    path = tmp_path_factory.mktemp("model") / "small.onnx"
    onnx.save(reference.small_cnn(), path)
    return path


@pytest.fixture
def importer_refusing_every_graph(monkeypatch):
    """TVM's ONNX importer raising on every graph with a node (an empty remainder still imports)."""
    from relaxc.frontend import relax_import

    real = relax_import.from_onnx

    def refusing(model, *args, **kwargs):
        if len(model.graph.node):
            raise NotImplementedError("refused on purpose by the test")
        return real(model, *args, **kwargs)

    monkeypatch.setattr(relax_import, "from_onnx", refusing)
