"""The Winograd rule: it takes the transforms, Dense takes the products, the epilogue is fused into
the output transform, each transform's first stage is computed per tile in a local buffer, and the
result is right for both tile sizes."""

import re

import numpy as np
import pytest
from tvm import tirx

import compiler
from schedules.default import schedule_kind
from tests import reference
from tests.helpers import store_choosing


@pytest.mark.parametrize("choice", ["winograd2", "winograd4"])
def test_transforms_and_products_get_their_rules(tmp_path, choice):
    model = reference.conv3x3(32, 48, 10, 10, 1, residual=False)
    art = compiler.compile(model, tuning="off", cache_dir=store_choosing(tmp_path, model, choice))
    kinds = {gv.name_hint: schedule_kind(f) for gv, f in art.module("final").functions.items()
             if isinstance(f, tirx.PrimFunc) and "winograd" in gv.name_hint}
    assert kinds == {"winograd_input": "winograd", "winograd_product": "dense",
                     "fused_winograd_output_add_relu": "winograd"}  # bias and ReLU fused into the output transform
    for kernel, stage in (("winograd_input", "winograd_input_rows"), ("fused_winograd_output_add_relu",
                                                                       "winograd_output_columns")):
        script = art.module("final")[kernel].script()
        assert re.search(rf'{stage}_local = T\.sblock_alloc_buffer\([^\n]*scope="local"', script)
        assert script.index("T.parallel(") < script.index(f'T.sblock("{stage}")')  # per tile, not the whole tensor
    x = np.random.default_rng(2).standard_normal((1, 32, 10, 10)).astype(np.float32)
    reference.assert_matches(art.run(x), reference.ort_run(model, {"x": x}))
