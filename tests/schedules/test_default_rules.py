"""schedules/default.py: the rules in order, labelled in one place, counted in the report."""

import pytest
import tvm
from tvm.target import Target

import relaxc
from relaxc.passes.ir import SCHEDULE_ATTR
from relaxc.schedules.default import DefaultSchedules, default_schedule, rules
from relaxc.schedules.cpu import tiled
from relaxc.support.errors import DoesNotFit, ScheduleRuleError
from relaxc.support.targets import vector_unit
from tests.schedules.test_tiling import AVX512, matmul


def test_each_target_gets_its_own_rules_in_order():
    assert [label for label, _ in rules(AVX512)] == ["int8", "winograd", "dense", "rows", "tiled", "basic"]
    no_dot = Target({"kind": "llvm", "mcpu": "x86-64"})  # the 8-bit convolutions' rule needs AVX2 at least
    assert [label for label, _ in rules(no_dot)] == ["winograd", "dense", "rows", "tiled", "basic"]
    gpu = [label for label, _ in rules(Target({"kind": "cuda", "arch": "sm_80"}))]
    assert gpu[0] == "gpu-matmul" and gpu[-1] == "gpu-fallback" and all(label.startswith("gpu-") for label in gpu)


def _declined(monkeypatch) -> None:
    monkeypatch.setattr(tiled, "_spatial_then_reduction", lambda _block: False)


def test_the_first_fitting_rule_wins_and_keeps_its_trace(monkeypatch):
    sch, label = default_schedule(matmul, AVX512)
    assert label == "tiled" and len(sch.trace.insts) > 0  # tuning records replay this trace
    _declined(monkeypatch)
    assert default_schedule(matmul, AVX512)[1] == "basic"


@pytest.mark.parametrize("declined, label", [(False, "tiled"), (True, "basic")])
def test_the_pass_labels_every_kernel_and_counts_them(monkeypatch, declined, label):
    if declined:
        _declined(monkeypatch)
    mod = tvm.IRModule({"mm": matmul.with_attr("global_symbol", "mm")})
    schedules = DefaultSchedules(AVX512)
    with AVX512:
        scheduled = schedules(mod)
    assert str(scheduled["mm"].attrs[SCHEDULE_ATTR]) == label and scheduled["mm"].attrs["tirx.is_scheduled"]
    assert schedules.summary() == {label: 1}
    assert SCHEDULE_ATTR not in (mod["mm"].attrs or {})  # its input is untouched


@pytest.mark.parametrize("model", ["onnx:squeezenet", "zoo:bert"])
def test_a_kernel_a_rule_rules_out_from_its_blocks_is_one_it_declines(model):
    """``may_fit`` only saves making a Schedule: every kernel it rules out, the rule itself declines
    (SqueezeNet has Winograd transforms and products, BERT dense and row-reduction kernels)."""
    target = Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
    fused = relaxc.compile(model, target=target, tuning="off").module("fuse")
    kernels = [f for f in fused.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    ruled_out = 0
    for label, rule in rules(target):
        for kernel in kernels:
            if not rule.may_fit(kernel):
                ruled_out += 1
                assert rule.schedule(kernel, vector_unit(target)) is None, (label, kernel.attrs["global_symbol"])
    assert ruled_out > len(kernels)


def _raising(error: Exception):
    def schedule(*_args):
        raise error
    return schedule


def test_a_rule_that_does_not_fit_says_so_and_the_next_one_schedules(monkeypatch):
    monkeypatch.setattr(tiled.Tiled, "schedule", _raising(DoesNotFit("not mine")))
    assert default_schedule(matmul, AVX512)[1] == "basic"


@pytest.mark.parametrize("error", [ValueError("injected"), TypeError("injected"), tvm.error.InternalError("injected")])
def test_any_other_error_inside_a_rule_fails_the_compile_naming_the_kernel(monkeypatch, error):
    """A bug in a rule is no reason to give a kernel the next rule's slower schedule unreported."""
    monkeypatch.setattr(tiled.Tiled, "schedule", _raising(error))
    mod = tvm.IRModule({"mm": matmul.with_attr("global_symbol", "mm")})
    expected = rf"the Tiled schedule rule failed on kernel mm: {type(error).__name__}: injected"
    with AVX512, pytest.raises(ScheduleRuleError, match=expected):
        DefaultSchedules(AVX512)(mod)
    with pytest.raises(ScheduleRuleError, match=r"the Tiled schedule rule failed on kernel \w+"):
        relaxc.compile("onnx:squeezenet", tuning="off")


@pytest.mark.slow
@pytest.mark.parametrize("model, bounds", [("zoo:bert_op23", None), ("zoo:bert_dynamic", {"batch": 2, "sequence": 64})])
def test_kernels_a_rule_declines_get_the_next_rule(model, bounds):
    """BERT at opset 23 has a reduction ``rfactor`` refuses, the dynamic one padded rows of dynamic
    width: kernels a rule says are not its (``DoesNotFit``), scheduled by the next. The other
    bundled and zoo models compile in their own tests, where a failing rule fails the compile."""
    schedules = relaxc.compile(model, tuning="off", backends="off", dim_bounds=bounds).report()["schedules"]
    assert schedules and "none" not in schedules
