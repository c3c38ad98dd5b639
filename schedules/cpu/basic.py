"""The ``Basic`` CPU rule: every block's outermost loop parallel, for kernels no other rule takes.

Always legal, never the naive serial loop TVM would emit without a schedule. Kernels that end up
here are counted as "basic" in ``report()["schedules"]``: each is a candidate for a rule of its own.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from relaxc.schedules.cpu.rule import CpuRule
from relaxc.support.targets import VectorUnit
from relaxc.support.tvm_internals import UncheckedSchedule


class Basic(CpuRule):
    """Parallelise the outermost loop of every block."""

    def schedule(self, func: tirx.PrimFunc, _unit: VectorUnit) -> s_tir.Schedule | None:
        sch = UncheckedSchedule(func)
        root = sch.get_sblock("root") if _has_root(sch) else None
        for block in sch.get_child_blocks(root) if root is not None else []:
            try:
                loops = sch.get_loops(block)
                if loops:
                    sch.parallel(loops[0])
            except s_tir.ScheduleError:  # TVM refuses a loop it cannot run in parallel (a reduction's)
                continue
        return sch


def _has_root(sch: s_tir.Schedule) -> bool:
    try:
        sch.get_sblock("root")
    except (s_tir.ScheduleError, ValueError):  # how TVM says no block has the name
        return False
    return True
