"""passes/tir/stack_buffers.py: small kernel-local buffers on the stack, big ones in TVM's workspace pool."""

import numpy as np
import tvm
import tvm_ffi
from tvm.script import tirx as T
from tvm.target import Target

from relaxc.passes.tir import stack_buffers, tir_pipeline
from relaxc.schedules.cpu import Tiled
from tests.schedules.test_tiling import _blocked_conv

TARGET = Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})  # AVX2: runs on every CPU this project meets


def _asm(lib: tvm.runtime.Module) -> str:
    return lib.inspect_source("asm")


def _uses_workspace(lib: tvm.runtime.Module) -> bool:
    return "TVMBackendAllocWorkspace@GOTPCREL" in _asm(lib)


def _build(func, pipeline: str) -> tvm.runtime.Module:
    return tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=TARGET,
                          pipeline=pipeline)


def test_register_tile_accumulators_leave_the_workspace_pool_and_results_stay():
    func = Tiled().apply(_blocked_conv(), TARGET, False).mod["main"]
    default, stacked = _build(func, "default"), _build(func, tir_pipeline.pipeline(TARGET))
    assert _uses_workspace(default), "TVM puts the local accumulators in its workspace pool"
    assert not _uses_workspace(stacked)
    rng = np.random.default_rng(0)
    shapes = [(1, 4, 58, 58, 16), (4, 4, 3, 3, 16, 16), (1, 4, 56, 56, 16)]
    args = [rng.standard_normal(s).astype("float32") for s in shapes]
    outputs = []
    for lib in (default, stacked):
        tensors = [tvm.runtime.tensor(a) for a in args]
        lib["main"](*tensors)
        outputs.append(tensors[-1].numpy())
    np.testing.assert_array_equal(outputs[0], outputs[1])


@T.prim_func
def _local_rows(a: T.Buffer((64, 8192), "float32"), b: T.Buffer((64, 8192), "float32")):
    for i in T.parallel(64):
        row = T.alloc_buffer((8192,), "float32", scope="local")  # 32 KiB: over the stack limit
        tile = T.alloc_buffer((256,), "float32", scope="local")  # 1 KiB: TVM's limit is for global scope only
        for j in range(8192):
            row[j] = a[i, j] * T.float32(2)
        for j in range(256):
            tile[j] = row[j]
        for j in range(8192):
            b[i, j] = row[j] + tile[j % 256]


def test_only_buffers_up_to_the_limit_move_to_the_stack():
    stacked = tvm.IRModule({"main": _local_rows})
    stacked = stack_buffers.StackBuffers(stacked)["main"]
    sizes = {}

    def record(alloc):
        sizes[int(alloc.buffer.shape[0])] = stack_buffers.DISABLE_LOWER_BUILTIN in alloc.annotations
        return alloc

    tvm_ffi.structural_map(stacked, (tvm.tirx.AllocBuffer, record))
    assert sizes == {8192: False, 256: True}
    assert 8192 * 4 > stack_buffers.MAX_STACK_BYTES >= 256 * 4

