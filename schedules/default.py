"""Default schedules for kernels that have no tuning record.

Without a schedule TVM emits naive serial loops on CPU (ResNet-50: seconds instead of
milliseconds) and kernels that do not build at all on a GPU, so every PrimFunc gets one here.
Rules are tried in order and the first that applies wins; the kernel is labelled with the rule
(``report()["schedules"]`` counts them apart from tuned kernels).
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

from schedules.cpu import SCHEDULE_ATTR, CPUDefault


class _Labelled(dl.ScheduleRule):
    """One of TVM's rules, its schedules labelled with ``label`` in ``SCHEDULE_ATTR``."""

    def __init__(self, rule: dl.ScheduleRule, label: str) -> None:
        self.rule = rule
        self.label = label

    def is_target_available(self, target: Target) -> bool:
        return self.rule.is_target_available(target)

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        sch = self.rule.apply(func, target, tunable)
        if sch is None:
            return None
        return s_tir.Schedule(sch.mod["main"].with_attr(SCHEDULE_ATTR, self.label))


def rules(target: Target) -> list[dl.ScheduleRule]:
    """The ordered default schedule rules for ``target``."""
    if target.kind.name == "llvm":
        return [CPUDefault()]
    # TVM's GPU rules; Fallback binds whatever is left (convs included) to threads
    gpu = {"gpu-matmul": dl.gpu.Matmul(), "gpu-gemv": dl.gpu.GEMV(), "gpu-reduction": dl.gpu.Reduction(),
           "gpu-general-reduction": dl.gpu.GeneralReduction(), "gpu-fallback": dl.gpu.Fallback()}
    return [_Labelled(rule, label) for label, rule in gpu.items()]


def apply_default_schedules(target: Target) -> tvm.transform.Pass:
    """A pass scheduling every PrimFunc that is not scheduled yet (tuned ones are left alone)."""
    return dl.ApplyDefaultSchedule(*rules(target))
