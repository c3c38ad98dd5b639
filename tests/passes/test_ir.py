"""passes/ir.py: the helpers every pass uses."""

import numpy as np
import tvm
from tvm import relax, tirx

from passes.ir import constant_array, is_op, map_relax_functions, static_shape


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
