"""What every relaxc CPU schedule rule shares: it applies to LLVM targets, schedules a kernel for
the target's vector unit (lanes and registers), and answers None for a kernel that is not its: one its
``may_fit`` rules out, or whose ``schedule`` answers None or raises ``DoesNotFit``, or where a TVM
schedule primitive refuses the kernel (``ScheduleError``: rfactor of a reduction it cannot split,
loop_partition of a padded loop). Any other error is a bug and goes on up
(``schedules/default.py`` names the kernel)."""

from __future__ import annotations

import logging

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

from relaxc.support.errors import DoesNotFit
from relaxc.support.targets import VectorUnit, vector_unit

log = logging.getLogger("relaxc")


def kernel_blocks(func: tirx.PrimFunc) -> list[s_tir.SBlock]:
    """The kernel's blocks (the root included), found without making a Schedule: rules try each
    kernel in turn, and a Schedule with dlight's block analysis costs 1-2 ms a time."""
    found: list[s_tir.SBlock] = []

    def collect(block: s_tir.SBlock) -> s_tir.SBlock:
        found.append(block)
        return block

    tvm_ffi.structural_map(func.body, (s_tir.SBlock, collect))
    return found


class CpuRule(dl.ScheduleRule):
    """Subclasses implement ``schedule(func, unit)``: a schedule, or None (or ``DoesNotFit``, where the
    finding is deep in the scheduling) if the kernel is not theirs;
    and may implement ``may_fit(func)``, a test of the kernel's blocks that rules out a kernel
    before a Schedule is made for it."""

    def is_target_available(self, target: Target) -> bool:
        return target.kind.name == "llvm"

    def may_fit(self, _func: tirx.PrimFunc) -> bool:
        return True

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.may_fit(func):
            return None
        try:
            return self.schedule(func, vector_unit(target))
        except (DoesNotFit, s_tir.ScheduleError) as err:
            log.debug("%s schedule does not fit: %s", type(self).__name__, err)
            return None

    def schedule(self, func: tirx.PrimFunc, unit: VectorUnit) -> s_tir.Schedule | None:
        raise NotImplementedError
