"""validate_memory's poisoning reaches a kernel's own buffers: a kernel that reads scratch it never wrote
shows it in its outputs (``passes/tir/poison.py``), and leaves a kernel that does not alone."""

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir
from tvm.script import tirx as T

from relaxc.passes.tir import tir_pipeline
from relaxc.passes.tir.poison import POISON_ATTR, FillScratch, PoisonScratch
from relaxc.support import targets

TARGET = targets.resolve("cpu")


@T.prim_func(s_tir=True)
def _faulty(x: T.Buffer((64,), "float32"), y: T.Buffer((64,), "float32")):
    """Writes half of its scratch and reads all of it: a kernel's bug, on purpose."""
    scratch = T.alloc_buffer((64,), scope="local")
    for i in range(32):
        with T.sblock("write"):
            v = T.axis.spatial(32, i)
            scratch[v] = x[v]
    for i in range(64):
        with T.sblock("read"):
            v = T.axis.spatial(64, i)
            y[v] = scratch[v] + T.float32(1)


def _run(mod: tvm.IRModule) -> np.ndarray:
    lib = tvm.compile(mod, target=TARGET, tir_pipeline=tir_pipeline.pipeline(TARGET))
    x, y = np.arange(64, dtype=np.float32), tvm.runtime.tensor(np.zeros(64, np.float32))
    lib["main"](tvm.runtime.tensor(x), y)
    return y.numpy()


def test_a_kernel_reading_scratch_it_never_wrote_shows_garbage_once_poisoned():
    mod = tvm.IRModule({"main": _faulty})
    poisoned = PoisonScratch(mod)
    assert poisoned["main"].attrs[POISON_ATTR]
    y = _run(poisoned)
    np.testing.assert_array_equal(y[:32], np.arange(32) + 1)  # what it wrote, as written
    assert (y[32:] == np.finfo(np.float32).max).all()  # what it did not: the poison, whatever the allocator left


def test_only_marked_kernels_are_filled():
    """The fill follows each allocation of a marked kernel once lowered; an unmarked one is left as it is."""
    lower = tvm.transform.Sequential([s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
                                      s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.LowerOpaqueBlock()])
    mod = tvm.IRModule({"main": _faulty.with_attr("target", TARGET)})
    plain, marked = lower(mod), lower(PoisonScratch(mod))
    assert tvm_ffi.structural_equal(FillScratch(plain)["main"], plain["main"])
    filled = FillScratch(marked)["main"].script()
    assert not tvm_ffi.structural_equal(FillScratch(marked)["main"], marked["main"]) and "poison_0" in filled
