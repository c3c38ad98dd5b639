"""Default schedules for kernels that have no tuning record.

Without a schedule TVM emits naive serial loops (ResNet-50: seconds instead of milliseconds), so
every PrimFunc gets one here. Rules are tried in order and the first that applies wins.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import dlight as dl
from tvm.target import Target

from schedules.cpu import CPUDefault


def rules(target: Target) -> list[dl.ScheduleRule]:
    """The ordered default schedule rules for ``target``."""
    if target.kind.name == "llvm":
        return [CPUDefault()]
    raise NotImplementedError(f"no default schedules for target kind {target.kind.name!r} yet")


def apply_default_schedules(target: Target) -> tvm.transform.Pass:
    """A pass scheduling every PrimFunc that is not scheduled yet (tuned ones are left alone)."""
    return dl.ApplyDefaultSchedule(*rules(target))
