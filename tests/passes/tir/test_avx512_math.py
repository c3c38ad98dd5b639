"""passes/tir/avx512_math.py and passes/tir/tir_pipeline.py: AVX-512 kernels get the AVX-512 sigmoid, other
targets and lane counts keep fast_math's portable form; its accuracy over the float32 range where
the machine can run AVX-512 code."""

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.target import Target, codegen

from relaxc.passes.tir import avx512_math, fast_math, tir_pipeline
from relaxc.support import targets
from tools.experiments import fast_math as measure

AVX512 = Target({"kind": "llvm", "mcpu": "skylake-avx512"})
AVX2 = Target({"kind": "llvm", "mcpu": "haswell"})
AVX512_INSTRUCTIONS = ("vscalefps", "vrcp14ps", "vpermps")


def _asm(target: Target, lanes: int) -> str:
    fast_math.register()
    return measure.kernel(te.sigmoid, 1024, target, lanes).mod.inspect_source("asm")


def test_avx512_kernels_use_the_avx512_instructions():
    asm = _asm(AVX512, 16)
    assert all(name in asm for name in AVX512_INSTRUCTIONS)
    assert "vdivps" not in asm


@pytest.mark.parametrize("target, lanes", [(AVX2, 8), (AVX512, 8)], ids=["avx2", "avx512-8-lanes"])
def test_other_targets_and_lane_counts_keep_the_portable_form(target, lanes):
    asm = _asm(target, lanes)
    assert not any(name in asm for name in AVX512_INSTRUCTIONS)
    assert "vdivps" not in asm, "fast_math's division-free sigmoid"


def test_gpu_targets_keep_tvms_pipeline():
    assert tir_pipeline.pipeline(Target("cuda")) == "default"
    assert not avx512_math.applies(Target("cuda"))


HOST = targets.resolve("cpu")


@pytest.mark.skipif(not codegen.target_has_features("avx512f", HOST), reason="this CPU has no AVX-512")
def test_accuracy_over_the_float32_range():
    fast_math.register()
    x = measure.inputs()
    e = measure.errors("sigmoid", measure.run(measure.kernel(te.sigmoid, len(x), HOST, 16), x), x)
    assert e["nan_exact"] and e["inf_exact"] and e["signs_exact"]
    assert e["max_ulp"] <= 4
    # subnormal results (x < -87.3) are computed, not flushed: within 4 ulp of the smallest normal
    assert (e["subnormal_errors"] <= 4 * 2.0**-23 * measure.TINY + 1.5e-45).all()
    limits = np.array([-np.inf, np.inf, 0.0, -1e30, 1e30, np.nan] + [0.0] * 10, np.float32)
    got = measure.run(measure.kernel(te.sigmoid, 16, HOST, 16), limits)[:6]
    assert got[:5].tolist() == [0.0, 1.0, 0.5, 0.0, 1.0] and np.isnan(got[5])
