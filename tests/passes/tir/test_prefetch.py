"""passes/tir/prefetch.py: a packed matmul whose weight panels outgrow L1 prefetches the next panel."""

import numpy as np
import tvm
from tvm import te
from tvm.script import tirx as T
from tvm.target import Target

from relaxc.passes.tir import prefetch, tir_pipeline
from relaxc.passes.winograd import winograd_product
from relaxc.schedules.cpu import Dense

TARGET = Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})  # AVX2: runs on every CPU this project meets


def _product(depth: int) -> tvm.tirx.PrimFunc:
    """A Winograd product of 16 tile positions, 24 rows, ``depth`` input channels and 64 output
    channels in panels of 32: a panel holds depth * 128 bytes."""
    v = te.placeholder((16, 24, depth), "float32", name="v")
    packed = te.placeholder((16, 2, depth, 32), "float32", name="packed")
    func = te.create_prim_func([v, packed, winograd_product(v, packed, tile_rows=6)])
    return Dense().apply(func, TARGET, False).mod["main"]


def _build(func: tvm.tirx.PrimFunc, pipeline: str) -> tvm.runtime.Module:
    return tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=TARGET,
                          pipeline=pipeline)


def _run(lib: tvm.runtime.Module, depth: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    shapes = [(16, 24, depth), (16, 2, depth, 32), (16, 24, 64)]
    tensors = [tvm.runtime.tensor(rng.standard_normal(s).astype("float32")) for s in shapes]
    lib["main"](*tensors)
    return tensors[-1].numpy()


def test_a_panel_larger_than_l1_prefetches_the_next_one_and_results_stay():
    func = _product(depth=256)  # 32 KiB panels
    assert prefetch.ATTR in func.script()
    marked, plain = _build(func, tir_pipeline.pipeline(TARGET)), _build(func, "default")
    assert "prefetcht1" in marked.inspect_source("asm")
    assert "prefetch" not in plain.inspect_source("asm")
    np.testing.assert_array_equal(_run(marked, 256), _run(plain, 256))


def test_a_panel_l1_holds_is_not_marked():
    assert prefetch.ATTR not in _product(depth=64).script()  # 8 KiB panels


@T.prim_func
def _marks_without_their_loops(a: T.Buffer((64, 512), "float32"), b: T.Buffer((64,), "float32")):
    with T.attr(0, prefetch.ATTR, prefetch.mark("a", 512)):  # no parallel loop around it
        for i in range(64):
            b[i] = a[i, 0]
    for i in T.parallel(64):
        with T.attr(0, prefetch.ATTR, prefetch.mark("missing", 512)):  # no loop reads that buffer
            for k in range(512):
                b[i] = b[i] + a[i, k]


def test_marks_whose_loops_are_not_found_are_dropped():
    func = prefetch.PrefetchNextPanel(tvm.IRModule({"main": _marks_without_their_loops}))["main"]
    assert prefetch.ATTR not in func.script()
    assert "prefetch" not in func.script()
