"""support/tvm_internals.UncheckedSchedule: the schedule rules' Schedule without TVM's Python type
checks, making the same schedules and still refusing a wrong argument."""

import pytest
import tvm
import tvm_ffi
from tvm import s_tir
from tvm.target import Target

from relaxc.schedules.cpu import Tiled, tiled
from relaxc.support.tvm_internals import UncheckedSchedule
from tests.schedules.test_tiling import _blocked_conv

TARGET = Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})


def test_every_type_checked_method_is_replaced():
    checked = {name for name, method in vars(s_tir.Schedule).items()
               if getattr(getattr(method, "__code__", None), "co_filename", "").endswith("_type_checker.py")}
    assert {"split", "get_loops", "compute_at", "vectorize", "parallel"} <= checked  # TVM still checks these
    assert all(getattr(UncheckedSchedule, name) is not getattr(s_tir.Schedule, name) for name in checked)
    assert all(getattr(UncheckedSchedule, name) is getattr(s_tir.Schedule, name).__wrapped__ for name in checked)


def test_a_rule_makes_the_same_schedule_and_trace(monkeypatch):
    func = _blocked_conv()
    unchecked = Tiled().apply(func, TARGET, False)
    monkeypatch.setattr(tiled, "UncheckedSchedule", s_tir.Schedule)
    checked = Tiled().apply(func, TARGET, False)
    assert isinstance(unchecked, UncheckedSchedule) and not isinstance(checked, UncheckedSchedule)
    assert tvm_ffi.structural_equal(unchecked.mod, checked.mod)
    assert str(unchecked.trace) == str(checked.trace)


def test_a_wrong_argument_is_still_refused():
    sch = UncheckedSchedule(_blocked_conv())
    with pytest.raises(Exception):
        sch.get_loops(42)
    with pytest.raises(Exception):
        sch.split(sch.get_loops(sch.get_sblock("conv"))[2], factors=["seven"])
    assert len(sch.get_loops(sch.get_sblock("conv"))) == 9  # the schedule is still usable
