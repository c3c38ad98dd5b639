import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import onnx  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """The small test CNN saved as a .onnx file, for command-line tests."""
    from tests import reference

    path = tmp_path_factory.mktemp("model") / "small.onnx"
    onnx.save(reference.small_cnn(), path)
    return path
