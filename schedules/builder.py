"""MetaSchedule's build step, without the 38-second import.

MetaSchedule's default build function imports ``tvm.s_tir.tensor_intrin``, which parses the tensor
intrinsics of every target as TVMScript: 38 s on this machine, paid again for every batch because
``LocalBuilder`` starts a fresh worker pool per batch, so every build hit its 30 s timeout. This
module is what the workers import instead (TVM, relaxc's fast math lowering and its TIR pipeline,
so that kernels are measured as the pipeline builds them); tuning also makes
the TuneContext's own import of that module free (``support.tvm_internals.skip_tensor_intrinsics``).

``PooledBuilder`` builds on worker processes kept for a whole tuning run, where ``LocalBuilder``
starts a pool for every batch and one more to check that it can: each start is a Python that
imports TVM, 3 s on this machine, 9 s of a 2-trial tuning run's 28.
"""

from __future__ import annotations

from typing import Sequence

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder, local_builder
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind
from tvm.target import Target

TIMEOUT_S = 30.0  # one kernel's build, as LocalBuilder's
USES = 64  # builds per worker process before a fresh one: workers grow with use (MetaSchedule's note)


def build(mod: tvm.IRModule, target: Target, _params) -> tvm.runtime.Module:
    """MetaSchedule's default build, minus the tensor-intrinsic import (fp32 CPU code uses none)."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from relaxc.passes.tir import fast_math, tir_pipeline

    fast_math.register()

    return tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target,
                     pipeline=tir_pipeline.pipeline(Target(target)))


def _build_and_export(mod: tvm.IRModule, target: Target) -> str:
    """One candidate built in a worker; the path of its library."""
    return local_builder.default_export(build(mod, target, None))


@derived_object
class PooledBuilder(PyBuilder):
    """MetaSchedule's builder on one pool of worker processes, kept until ``shutdown``."""

    def __init__(self) -> None:
        super().__init__()
        self._pool = PopenPoolExecutor(timeout=TIMEOUT_S, maximum_process_uses=USES)  # a worker per CPU

    def build(self, build_inputs: Sequence[BuilderInput]) -> list[BuilderResult]:
        results = []
        for done in self._pool.map_with_error_catching(lambda x: _build_and_export(x.mod, x.target), build_inputs):
            if done.status == StatusKind.COMPLETE:
                results.append(BuilderResult(done.value, None))
            elif done.status == StatusKind.TIMEOUT:
                results.append(BuilderResult(None, f"PooledBuilder: Timeout, killed after {TIMEOUT_S} seconds"))
            else:
                results.append(BuilderResult(None, f"PooledBuilder: An exception occurred\n{done.value}"))
        return results

    def shutdown(self) -> None:
        self._pool.shutdown()
