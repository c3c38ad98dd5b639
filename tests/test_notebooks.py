"""Every notebook's code cells run top to bottom without error, so the walkthroughs stay true."""

import json
import pathlib

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path):
    cells = json.loads(path.read_text())["cells"]
    namespace: dict = {"__name__": "__notebook__"}
    for index, cell in enumerate(c for c in cells if c["cell_type"] == "code"):
        exec(compile("".join(cell["source"]), f"{path.name}[{index}]", "exec"), namespace)
