"""passes/ir.py: the helpers every pass uses."""

import numpy as np
import tvm
from tvm import relax, tirx

from relaxc.passes import ir
from relaxc.passes.ir import constant_array, is_op, map_relax_functions, static_shape


def test_static_shape_is_none_when_any_dim_is_symbolic():
    assert static_shape(relax.Var("a", relax.TensorType((1, 3, 8, 8), "float32"))) == (1, 3, 8, 8)
    n = tirx.Var("n", "int64")
    assert static_shape(relax.Var("b", relax.TensorType((n, 3, 8, 8), "float32"))) is None
    assert static_shape(relax.Var("c", relax.TensorType(ndim=4, dtype="float32"))) is None
    assert static_shape(relax.Var("s", relax.ShapeType([1]))) is None


def test_is_op_names_relax_operators_only():
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    assert is_op(relax.op.add(x, x), "relax.add") and not is_op(relax.op.add(x, x), "relax.multiply")
    assert not is_op(x, "relax.add")


def test_map_relax_functions_leaves_its_input_untouched():
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    with builder.function("main", [x]):
        builder.emit_func_output(x)
    mod = builder.get()
    before = mod["main"]
    new = map_relax_functions(mod, lambda f: relax.Function(f.params, relax.op.negative(f.body), f.ret_ty))
    assert mod["main"].same_as(before) and not new["main"].same_as(before)


def test_constant_array_reads_constants_only():
    assert constant_array(relax.const(np.arange(3, dtype="int64"))).tolist() == [0, 1, 2]
    assert constant_array(relax.Var("x", relax.TensorType((3,), "int64"))) is None


def test_constant_array_is_a_read_only_view_of_the_constant():
    weight = relax.const(np.arange(6, dtype="float32").reshape(2, 3))
    array = constant_array(weight)
    assert array.tolist() == [[0, 1, 2], [3, 4, 5]] and not array.flags.writeable
    assert array.ctypes.data == constant_array(weight).ctypes.data  # the constant's memory, not a copy
    half = constant_array(relax.const(np.ones(3, dtype="float32"), "bfloat16"))  # no DLPack view: a copy
    assert half.astype("float32").tolist() == [1, 1, 1]


def test_constant_shares_an_aligned_arrays_memory_and_copies_others():
    """``ir.constant`` wraps an ``aligned_empty`` array without copying it (the Winograd weights'
    copy was 0.2 s of VGG-19's compile) and still takes any other array, by copy."""
    aligned = ir.aligned_empty((3, 5, 7))
    assert aligned.ctypes.data % ir.TVM_ALIGNMENT == 0 and aligned.flags.c_contiguous
    aligned[...] = np.arange(aligned.size, dtype=np.float32).reshape(aligned.shape)
    shared = ir.constant(aligned)
    assert np.from_dlpack(shared.value).ctypes.data == aligned.ctypes.data
    np.testing.assert_array_equal(shared.value.numpy(), aligned)
    unaligned = np.arange(36, dtype=np.float32)[1:].reshape(5, 7)  # 4 bytes past an allocation
    copied = ir.constant(unaligned)
    assert np.from_dlpack(copied.value).ctypes.data != unaligned.ctypes.data
    np.testing.assert_array_equal(copied.value.numpy(), unaligned)
