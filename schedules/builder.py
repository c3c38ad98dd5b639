"""MetaSchedule's build step, without the 38-second import.

MetaSchedule's default build function imports ``tvm.s_tir.tensor_intrin``, which parses the tensor
intrinsics of every target as TVMScript: 38 s on this machine, paid again for every batch because
``LocalBuilder`` starts a fresh worker pool per batch, so every build hit its 30 s timeout. This
module is what the workers import instead (TVM, relaxc's fast math lowering and its TIR pipeline,
so that kernels are measured as the pipeline builds them); tuning also makes
the TuneContext's own import of that module free (``support.tvm_internals.skip_tensor_intrinsics``).
"""

from __future__ import annotations

import tvm
from tvm.target import Target


def build(mod: tvm.IRModule, target: Target, _params) -> tvm.runtime.Module:
    """MetaSchedule's default build, minus the tensor-intrinsic import (fp32 CPU code uses none)."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from relaxc.passes import fast_math, tir_pipeline

    fast_math.register()

    return tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target,
                     pipeline=tir_pipeline.pipeline(Target(target)))
