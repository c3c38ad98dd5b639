"""How fast an int8 product (uint8 x int8 -> int32) runs with AVX-512 VNNI from a plain TIR schedule,
against onnxruntime's ``MatMulInteger`` and its float32 ``MatMul`` on the same shape
(``python -m tools.experiments.int8_gemm [M N K]...``, 2 threads each).

    .venv/bin/python -m tools.experiments.int8_gemm 128 768 768 784 128 1152 3136 64 576

Why: int8 kernels must beat onnxruntime's int8; this measures what one register-tiled schedule
reaches before anything is built into the pipeline. Weights are packed ``[N/16, K/4, 16, 4]`` (16
output lanes, 4 bytes deep: one ``vpdpbusd`` multiplies a broadcast 4-byte group of a row into 16
lanes); ``MB`` rows by ``NB`` 16-lane blocks of accumulators stay in registers (the intrinsic of
``schedules/cpu/int8.py``, which the integer convolutions use).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import s_tir
from tvm.script import tirx as T

from relaxc.schedules.cpu.int8 import intrinsic
from relaxc.support import targets
from relaxc.support.threads import configure_threads


def product(M: int, N: int, K: int) -> tvm.tirx.PrimFunc:
    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((M, K), "uint8"), W: T.Buffer((N // 16, K // 4, 16, 4), "int8"),
             C: T.Buffer((M, N), "int32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i, j, k in T.grid(M, N, K):
            with T.sblock("C"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    C[vi, vj] = 0
                C[vi, vj] = C[vi, vj] + T.cast(A[vi, vk], "int32") * \
                    T.cast(W[vj // 16, vk // 4, vj % 16, vk % 4], "int32")
    return func


def schedule(M: int, N: int, K: int) -> tvm.IRModule:
    """Register tiles of ``MB`` rows by ``NB`` lanes blocks, the reduction in chunks of at most 256
    bytes a row (a chunk of the packed weights stays in L1), tiles split between the threads."""
    rows = next(r for r in (8, 7, 6, 4, 2, 1) if M % r == 0)
    blocks = next(b for b in (3, 4, 2, 1) if (N // 16) % b == 0 and rows * b <= 28)
    sch = s_tir.Schedule(product(M, N, K))
    block = sch.get_sblock("C")
    i, j, k = sch.get_loops(block)
    io, ii = sch.split(i, [None, rows])
    jo, jb, ji = sch.split(j, [None, blocks, 16])
    ko, ki = sch.split(k, [None, 4])
    kt, ko = sch.split(ko, [None, max(d for d in range(1, 65) if (K // 4) % d == 0)])
    sch.reorder(jo, io, kt, ko, ii, jb, ji, ki)
    parallel = sch.fuse(jo, io)
    sch.parallel(parallel)
    sch.reverse_compute_at(sch.cache_write(block, 0, "local"), parallel)
    sch.decompose_reduction(block, kt)
    sch.tensorize(ji, intrinsic(dict(targets.BYTE_DOTS)["avx512vnni"]))
    sch.unroll(jb)
    sch.unroll(ii)
    return sch.mod


def _ms(call, runs: int = 50) -> float:
    call()
    blocks = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(runs):
            call()
        blocks.append((time.perf_counter() - start) / runs)
    return statistics.median(blocks) * 1e3


def _session(op: str, a_type: int, w: np.ndarray, c_type: int, M: int, N: int, K: int):
    import onnxruntime as ort

    graph = helper.make_graph([helper.make_node(op, ["a", "w"], ["c"])], "g",
                              [helper.make_tensor_value_info("a", a_type, [M, K])],
                              [helper.make_tensor_value_info("c", c_type, [M, N])], [numpy_helper.from_array(w, "w")])
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def measure(M: int, N: int, K: int) -> str:
    cpu = targets.host_cpu()
    lib = tvm.compile(schedule(M, N, K), target=tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": 2}))
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (M, K), dtype=np.uint8)
    w = rng.integers(-128, 128, (N, K), dtype=np.int8)
    packed = w.reshape(N // 16, 16, K // 4, 4).transpose(0, 2, 1, 3).copy()
    args = [tvm.runtime.tensor(x) for x in (a, packed, np.zeros((M, N), np.int32))]
    lib["main"](*args)
    want = a.astype(np.int32) @ w.astype(np.int32).T
    assert np.array_equal(args[2].numpy(), want), "the VNNI product is wrong"
    integer = _session("MatMulInteger", TensorProto.UINT8, w.T.copy(), TensorProto.INT32, M, N, K)
    assert np.array_equal(integer.run(None, {"a": a})[0], want)
    floats = _session("MatMul", TensorProto.FLOAT, w.T.astype(np.float32), TensorProto.FLOAT, M, N, K)
    af = a.astype(np.float32)
    ms = {"vnni": _ms(lambda: lib["main"](*args)), "ort int8": _ms(lambda: integer.run(None, {"a": a})),
          "ort float32": _ms(lambda: floats.run(None, {"a": af}))}
    ops = 2 * M * N * K / 1e6
    return f"| {M}x{N}x{K} | " + " | ".join(f"{t:.3f} ({ops / t:.0f})" for t in ms.values()) + \
        f" | {ms['ort int8'] / ms['vnni']:.2f}x |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[128, 768, 768], help="M N K, repeated")
    args = parser.parse_args()
    if "avx512vnni" not in (targets.host_isa() or frozenset()):
        raise SystemExit("this CPU has no AVX-512 VNNI")
    configure_threads()
    print(f"{targets.host_cpu()}, 2 threads; ms (GOPS)\n| M x N x K | VNNI | onnxruntime int8 | onnxruntime float32 "
          "| VNNI speed / onnxruntime int8 |\n| --- | ---: | ---: | ---: | ---: |")
    for M, N, K in zip(args.sizes[::3], args.sizes[1::3], args.sizes[2::3]):
        print(measure(M, N, K), flush=True)


if __name__ == "__main__":
    main()
