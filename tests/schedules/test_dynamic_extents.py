"""Kernels of dynamic extents get the schedule their rule gives them at a representative size,
replayed, where every split of a dynamic extent divides it; otherwise the next rule takes them."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te, tirx

from relaxc.passes.tir import tir_pipeline
from relaxc.schedules.cpu import Tiled
from relaxc.schedules.default import replayed
from relaxc.schedules.dynamic import representative_sizes
from relaxc.support import targets

TARGET = targets.resolve("cpu")


def _scaled(extent) -> tirx.PrimFunc:
    x = te.placeholder((extent, 64), "float32", name="x")
    return te.create_prim_func([x, te.compute(x.shape, lambda i, j: x[i, j] * 2.0 + 1.0, name="y")])


def _run(func: tirx.PrimFunc, rows: int) -> np.ndarray:
    lib = tvm.compile(tvm.IRModule({"main": func}), target=TARGET, tir_pipeline=tir_pipeline.pipeline(TARGET))
    x = np.random.default_rng(rows).standard_normal((rows, 64)).astype(np.float32)
    y = tvm.runtime.tensor(np.zeros_like(x))
    lib["main"](tvm.runtime.tensor(x), y)
    return x, y.numpy()


def test_representative_sizes_are_primes_just_below_sixteen_times_a_prime():
    assert representative_sizes({"sequence": 384, "batch": 16}) == {"sequence": 409, "batch": 349}  # 32 x 13 - 7, 32 x 11 - 3
    assert representative_sizes({"sequence": 384}, 16) == {"sequence": 463}  # 16 x 29 - 1


def test_a_replayed_schedule_runs_at_every_size():
    n = tirx.Var("n", "int64")
    sch = replayed(Tiled(), _scaled(n), TARGET, representative_sizes({"n": 64}))
    assert sch is not None and "T.parallel" in sch.mod["main"].script() and "T.vectorized" in sch.mod["main"].script()
    for rows in (1, 5, 64, 113):
        x, y = _run(sch.mod["main"], rows)
        np.testing.assert_array_equal(y, x * 2 + 1)


def test_a_split_that_does_not_divide_a_dynamic_extent_is_not_replayed():
    """Tiles of 16 rows over a padded extent replay (16 divides it at every size); over the bare
    one they would test every row of the last tile, so the rule's schedule is not used."""
    n = tirx.Var("n", "int64")

    def tiled_rows(func):  # a rule that tiles rows by 16
        from tvm import s_tir

        class Rows16(Tiled):
            def schedule(self, f, unit):
                sch = s_tir.Schedule(f)
                i, j = sch.get_loops(sch.get_sblock("y"))
                sch.split(i, [None, 16])
                sch.vectorize(j)
                return sch
        return replayed(Rows16(), func, TARGET, representative_sizes({"n": 64}))

    assert tiled_rows(_scaled((n + 15) // 16 * 16)) is not None
    assert tiled_rows(_scaled(n)) is None


def _divisors(func: tirx.PrimFunc) -> list:
    """The divisors of every division and modulo in ``func``."""
    found = []
    tvm_ffi.structural_map(func.body, [(kind, lambda node: found.append(node.b) or node)
                                       for kind in (tirx.FloorDiv, tirx.FloorMod)])
    return found


def test_a_dynamic_copy_runs_in_parallel_over_its_leading_loops_only():
    """Keys padded and laid out per head (batch, sequence, 4, 64 -> batch, 4, padded, 64): the
    parallel loop fuses batch and heads, the padded keys run inside it, so no iteration divides by
    a dynamic extent; and it runs right at every size."""
    b, s = tirx.Var("batch", "int64"), tirx.Var("sequence", "int64")
    padded = (s + 31) // 32 * 32
    x = te.placeholder((b, s, 4, 64), "float32", name="x")
    y = te.compute((b, 4, padded, 64), lambda i, h, k, d: tvm.te.if_then_else(
        k < s, x[i, tvm.te.min(k, s - 1), h, d], tirx.const(0.0, "float32")), name="y")
    sch = replayed(Tiled(), te.create_prim_func([x, y]), TARGET, representative_sizes({"batch": 16, "sequence": 384}))
    assert sch is not None
    divisors = _divisors(sch.mod["main"])
    assert divisors and all(isinstance(d, tirx.IntImm) for d in divisors), divisors
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=TARGET, tir_pipeline=tir_pipeline.pipeline(TARGET))
    for batch, keys in ((1, 7), (3, 40)):
        data = np.random.default_rng(keys).standard_normal((batch, keys, 4, 64)).astype(np.float32)
        out = tvm.runtime.tensor(np.full((batch, 4, -(-keys // 32) * 32, 64), np.nan, np.float32))
        lib["main"](tvm.runtime.tensor(data), out)
        expected = np.zeros(out.shape, np.float32)
        expected[:, :, :keys] = data.transpose(0, 2, 1, 3)
        np.testing.assert_array_equal(out.numpy(), expected)


def _one_query_scores(heads: int, groups: int) -> tirx.PrimFunc:
    """A decoder's one-token attention scores as ``decode`` has them: a query per head times a
    transposed cache of keys read in place up to the padded length (``past // 32 * 32 + 32`` once
    the sequence is bound to 1), the padded keys masked to -inf."""
    b, past = tirx.Var("batch", "int64"), tirx.Var("past", "int64")
    padded = past // 32 * 32 + 32
    q = te.placeholder((b, heads, 1, 64), "float32", name="q")
    cache = te.placeholder((b, heads // groups, 64, 256), "float32", name="cache")
    mask = te.placeholder((b, 1, 1, padded), "float32", name="mask")
    d = te.reduce_axis((0, 64), name="d")
    scores = te.compute((b, heads, 1, padded), lambda i, h, m, k: te.sum(q[i, h, m, d] * cache[i, h // groups, d, k],
                                                                          axis=d), name="matmul")
    masked = te.compute(scores.shape, lambda i, h, m, k: tvm.tirx.Select(
        k <= past, scores[i, h, m, k] + mask[i, 0, 0, k], tirx.const(float("-inf"), "float32")), name="masked")
    return te.create_prim_func([q, cache, mask, past, masked])


@pytest.mark.parametrize("heads,groups", [(12, 3), (16, 1)])
@pytest.mark.parametrize("target", [TARGET, targets.resolve({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})],
                         ids=["host", "avx2"])
def test_a_one_query_attention_tile_attaches_its_epilogue_over_its_own_heads(heads, groups, target):
    """A tile of heads fused with dynamic tiles of keys into the parallel loop: TVM's analyzer lost
    the head tile's index (it divides by ``past // 32 * 2 + 2``), so the masking epilogue ran over a
    range of heads wider than its tile, from accumulators other iterations had not written (a 125 M
    decoder's logits garbage at every step). Fused only over the loops of constant extents, the
    epilogue's range is its tile's, and the scores are right at every length."""
    func = _one_query_scores(heads, groups)
    sch = replayed(Tiled(), func, target, representative_sizes({"batch": 4, "past": 255}))
    assert sch is not None and "T.parallel" in sch.mod["main"].script()
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=target, tir_pipeline=tir_pipeline.pipeline(target))
    rng = np.random.default_rng(heads)
    for batch, past in ((1, 0), (1, 40), (3, 200)):
        padded = past // 32 * 32 + 32
        q = rng.standard_normal((batch, heads, 1, 64)).astype(np.float32)
        cache = rng.standard_normal((batch, heads // groups, 64, 256)).astype(np.float32)
        mask = rng.standard_normal((batch, 1, 1, padded)).astype(np.float32)
        out = tvm.runtime.tensor(np.full((batch, heads, 1, padded), np.nan, np.float32))
        lib["main"](*(tvm.runtime.tensor(a) for a in (q, cache, mask)), past, out)
        keys = np.repeat(cache, groups, axis=1)[..., :padded]
        expected = np.einsum("bhmd,bhdk->bhmk", q, keys) + mask
        expected[..., past + 1:] = -np.inf
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-4)
