"""passes/cse.py: TVM's common subexpression elimination, large weights compared by object."""

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from relaxc.passes.cse import EliminateCommonSubexpr

ROWS = 1024  # a (1024, 512) float32 weight is 2 MB: lifted; a (1024, 8) one is 32 KB: not


def _module(weights: list, offsets: list) -> tvm.IRModule:
    """main(x) = sum over i of matmul(x + offsets[i], weights[i])."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, ROWS), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            terms = [builder.emit(relax.op.matmul(builder.emit(relax.op.add(x, b)), w))
                     for w, b in zip(weights, offsets)]
            total = terms[0]
            for term in terms[1:]:
                total = builder.emit(relax.op.add(total, term))
            out = builder.emit_output(total)
        builder.emit_func_output(out)
    return builder.get()


def _weight(columns: int, seed: int = 0) -> relax.Expr:
    return relax.const(np.random.default_rng(seed).standard_normal((ROWS, columns), dtype=np.float32))


def _count(mod: tvm.IRModule, op: str) -> int:
    return mod["main"].script(show_meta=False).count(f"R.{op}(")


def test_large_weights_used_twice_merge_as_tvm_merges_them():
    weight = _weight(512)
    mod = _module([weight, weight], [relax.const(1.0), relax.const(1.0)])
    ours = EliminateCommonSubexpr()(mod)
    assert _count(mod, "matmul") == 2 and _count(ours, "matmul") == 1
    assert tvm_ffi.structural_equal(ours, relax.transform.EliminateCommonSubexpr()(mod))
    assert ours["main"].params[0].same_as(mod["main"].params[0]) and len(ours["main"].params) == 1


def test_the_weights_come_back_as_the_same_constants():
    weights = [_weight(512, seed) for seed in range(2)]
    ours = EliminateCommonSubexpr()(_module(weights, [relax.const(1.0), relax.const(2.0)]))
    constants = []
    relax.analysis.post_order_visit(ours["main"], lambda e: constants.append(e) if isinstance(e, tvm.ir.GenericConst)
                                    and len(e.value.shape) == 2 else None)
    assert {c.__chandle__() for c in constants} == {w.__chandle__() for w in weights}


def test_large_equal_weights_in_distinct_constants_stay_apart():
    offsets = [relax.const(1.0), relax.const(1.0)]
    mod = _module([_weight(512), _weight(512)], offsets)  # equal bytes, two objects
    assert _count(relax.transform.EliminateCommonSubexpr()(mod), "matmul") == 1  # TVM reads the bytes
    ours = EliminateCommonSubexpr()(mod)
    assert _count(ours, "matmul") == 2
    assert _count(ours, "add") == 2  # x + 1.0 twice, in two small constants: merged by value, and the sum


def test_small_weights_go_to_tvm_as_they_are():
    mod = _module([_weight(8), _weight(8)], [relax.const(1.0), relax.const(1.0)])  # 32 KB each
    ours = EliminateCommonSubexpr()(mod)
    assert _count(ours, "matmul") == 1
    assert tvm_ffi.structural_equal(ours, relax.transform.EliminateCommonSubexpr()(mod))
