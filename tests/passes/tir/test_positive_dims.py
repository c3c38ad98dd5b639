"""Kernels told that dynamic dims are at least 1: register tiles under a loop fused over dynamic
extents are indexed by constants once TVM compacts them, and the results do not change."""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir, te, tirx

from relaxc.passes.tir import tir_pipeline
from relaxc.passes.tir.positive_dims import at_least_one
from relaxc.schedules.cpu import Tiled
from relaxc.schedules.default import replayed
from relaxc.schedules.dynamic import representative_sizes
from relaxc.support import targets

TARGET = targets.resolve("cpu")


def _batched_product() -> tirx.PrimFunc:
    """(b, 4, s8, 64) x (b, 4, 64, s32): attention's scores, rows and keys padded as relaxc pads them."""
    b, s = tirx.Var("batch", "int64"), tirx.Var("sequence", "int64")
    rows, keys = (s + 7) // 8 * 8, (s + 31) // 32 * 32
    heads, depth = tirx.const(4, "int64"), tirx.const(64, "int64")
    q = te.placeholder((b, heads, rows, depth), "float32", name="q")
    k = te.placeholder((b, heads, depth, keys), "float32", name="k")
    r = te.reduce_axis((tirx.const(0, "int64"), depth), name="r")
    out = te.compute((b, heads, rows, keys), lambda n, h, i, j: te.sum(q[n, h, i, r] * k[n, h, r, j], axis=r), name="p")
    return te.create_prim_func([q, k, s, out])  # the keys' length: no buffer has it as a dim


def _scheduled(func: tirx.PrimFunc) -> tirx.PrimFunc:
    sch = replayed(Tiled(), func, TARGET, representative_sizes({"batch": 16, "sequence": 384}))
    assert sch is not None
    return sch.mod["main"]


def _local_indices(func: tirx.PrimFunc) -> list[tirx.PrimExpr]:
    """The indices of every store to a local buffer, after TVM compacts the buffers."""
    mod = tvm.IRModule({"main": func})
    for step in (s_tir.transform.LowerInitBlock(), s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
                 s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.CompactBufferAllocation(),
                 s_tir.transform.StmtSimplify()):
        mod = step(mod)
    found: list[tirx.PrimExpr] = []

    def note(store):
        if "local" in str(store.buffer.data.ty):
            found.extend(store.indices)
        return store

    tvm_ffi.structural_map(mod["main"].body, (tirx.BufferStore, note))
    return found


def _parallel_var(func: tirx.PrimFunc) -> tirx.Var:
    loops = []
    tvm_ffi.structural_map(func.body, (tirx.For, lambda loop: loops.append(loop) or loop))
    return next(loop.loop_var for loop in loops if loop.kind == tirx.ForKind.PARALLEL)


def test_register_tiles_are_indexed_without_the_parallel_loop():
    scheduled = _scheduled(_batched_product())
    parallel = _parallel_var(scheduled)
    uses = lambda indices: [i for i in indices if any(v.same_as(parallel) for v in tirx.analysis.undefined_vars(i))]  # noqa: E731
    assert uses(_local_indices(scheduled))  # unknown signs: the tile's offset computed per iteration
    bound = at_least_one(scheduled, {"batch", "sequence"})
    indices = _local_indices(bound)
    assert indices and not uses(indices)


def test_the_kernel_computes_the_same_at_every_size():
    scheduled = _scheduled(_batched_product())
    lib = tvm.compile(tvm.IRModule({"main": at_least_one(scheduled, {"batch", "sequence"})}), target=TARGET,
                      tir_pipeline=tir_pipeline.pipeline(TARGET))
    rng = np.random.default_rng(0)
    for batch, sequence in ((1, 1), (2, 7), (1, 40)):
        rows, keys = -(-sequence // 8) * 8, -(-sequence // 32) * 32
        q = rng.standard_normal((batch, 4, rows, 64)).astype(np.float32)
        k = rng.standard_normal((batch, 4, 64, keys)).astype(np.float32)
        out = tvm.runtime.tensor(np.zeros((batch, 4, rows, keys), np.float32))
        lib["main"](tvm.runtime.tensor(q), tvm.runtime.tensor(k), sequence, out)
        np.testing.assert_allclose(out.numpy(), q @ k, rtol=1e-5, atol=1e-4)


def test_a_kernel_without_those_dims_is_left_as_it_is():
    scheduled = _scheduled(_batched_product())
    assert at_least_one(scheduled, {"image"}).same_as(scheduled)
