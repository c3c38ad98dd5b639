import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The user's cache of this test session (its subprocesses too): empty, over the stores
# relaxc ships, never the user's own.
os.environ["RELAXC_CACHE_DIR"] = os.path.join(tempfile.mkdtemp(prefix="relaxc-test-cache-"), "records")

import onnx  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """The small test CNN saved as a .onnx file, for command-line tests."""
    from tests import reference

    path = tmp_path_factory.mktemp("model") / "small.onnx"
    onnx.save(reference.small_cnn(), path)
    return path
