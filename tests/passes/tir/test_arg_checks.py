"""passes/tir/arg_checks.py: kernels keep only the argument checks the VM does not make; the VM refuses
what the dropped ones refused."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import tirx as T
from tvm.target import Target

import relaxc
from relaxc.passes.tir import arg_checks, tir_pipeline
from tests import reference

TARGET = Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})  # AVX2: runs on every CPU this project meets


@T.prim_func
def _doubled(a: T.Buffer((4, 16), "float32", offset_factor=16),
             b: T.Buffer((4, 16), "float32", offset_factor=16)):  # offset_factor: an alignment check
    assert a[0, 0] < T.float32(100), "first value too large"
    for i, j in T.grid(4, 16):
        b[i, j] = a[i, j] * T.float32(2)


def _module() -> tvm.IRModule:
    return tvm.IRModule({"main": _doubled.with_attr("global_symbol", "main")})


def _assert_messages(pipeline: str) -> list[str]:
    lower = tvm.tirx.get_tir_pipeline(pipeline)[0]
    lowered = lower(tvm.tirx.transform.BindTarget(TARGET.with_host(TARGET))(_module()))
    messages = []

    def record(check):
        messages.append(arg_checks._message(check))
        return check

    tvm_ffi.structural_map(lowered, (tvm.tirx.AssertStmt, record))
    return messages


def test_only_the_checks_the_vm_makes_are_dropped():
    default = _assert_messages("default")
    kept = _assert_messages(tir_pipeline.pipeline(TARGET))
    verified = [m for m in default if arg_checks.VERIFIED_BY_VM.search(m)]
    # TVM's messages still match: count, types, ndim, dtype, two shape dimensions per tensor, device id
    assert len(verified) >= 2 + 2 * 2 + 2 * 2 + 2 * 2 + 1
    assert [m for m in default if m not in verified] == kept
    for fragment in ("Misaligned", ".strides on argument", ".device_type on argument", "data pointer is NULL",
                     "first value too large"):
        assert any(fragment in m for m in kept), fragment


def test_the_kernel_body_assert_still_raises():
    lib = tvm.tirx.build(_module(), target=TARGET, pipeline=tir_pipeline.pipeline(TARGET))
    a = np.arange(64, dtype="float32").reshape(4, 16)
    b = tvm.runtime.tensor(np.zeros_like(a))
    lib["main"](tvm.runtime.tensor(a), b)
    np.testing.assert_array_equal(b.numpy(), 2 * a)
    a[0, 0] = 1000
    with pytest.raises(Exception, match="first value too large"):
        lib["main"](tvm.runtime.tensor(a), b)


@pytest.mark.parametrize("change", ["shape", "dtype", "ndim"])
def test_the_vm_refuses_what_the_dropped_checks_refused(change):
    """Called directly, not through relaxc's own input checks (``compiler/runtime/runner.py``)."""
    artifact = relaxc.compile(reference.small_cnn())
    _, shape, dtype = artifact.inputs[0]
    good = np.zeros(shape, dtype)
    bad = {"shape": np.zeros((*shape[:-1], shape[-1] + 1), dtype), "dtype": good.astype("float64"),
           "ndim": good[0]}[change]
    vm = relax.VirtualMachine(artifact.executable, tvm.cpu())
    assert vm["main"](tvm.runtime.tensor(good)) is not None
    with pytest.raises(Exception, match=r"param=x"):
        vm["main"](tvm.runtime.tensor(bad))
