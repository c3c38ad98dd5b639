"""MetaSchedule's build step, without the 38-second import.

MetaSchedule's default build function imports ``tvm.s_tir.tensor_intrin``, which parses the tensor
intrinsics of every target as TVMScript: 38 s on this machine, paid again for every batch because
``LocalBuilder`` starts a fresh worker pool per batch, so every build hit its 30 s timeout. This
module is what the workers import instead (TVM only, nothing of relaxc's compiler).
"""

from __future__ import annotations

import sys
import types

import tvm
from tvm.target import Target

INTRIN_MODULE = "tvm.s_tir.tensor_intrin"


def build(mod: tvm.IRModule, target: Target, _params) -> tvm.runtime.Module:
    """MetaSchedule's default build, minus the tensor-intrinsic import (fp32 CPU code uses none)."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def skip_tensor_intrinsics(target: Target) -> None:
    """Let MetaSchedule's TuneContext import the intrinsics module as an empty one, for LLVM targets.

    The default LLVM schedule rules use no tensor intrinsic (they are for int8 dot products and GPU
    tensor cores), so nothing is lost there; other targets keep the real import.
    """
    if target.kind.name == "llvm" and INTRIN_MODULE not in sys.modules:
        sys.modules[INTRIN_MODULE] = types.ModuleType(INTRIN_MODULE, "skipped by relaxc for LLVM tuning")
