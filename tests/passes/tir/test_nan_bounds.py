"""NaNThroughBounds: NaN passes a ReLU's or Clip's bound; a clamp cast to an integer turns it into its bound."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import te, tirx

from relaxc.passes.tir.nan_bounds import NaNThroughBounds


def _stored(func: tirx.PrimFunc) -> list[tirx.PrimExpr]:
    values = []
    tvm_ffi.structural_map(func.body, (tirx.BufferStore, lambda store: values.append(store.value) or store))
    return values


def test_bounds_come_first_but_a_cast_clamp_keeps_its_outer_bound_second():
    x = te.placeholder((16,), "float32", name="x")
    relu = te.compute((16,), lambda i: te.max(x[i], tirx.const(0.0, "float32")), name="relu")
    quantized = te.compute((16,), lambda i: te.max(te.min(x[i], tirx.const(255.0, "float32")),
                                                   tirx.const(0.0, "float32")).astype("uint8"), name="q")
    func = te.create_prim_func([x, relu, quantized])
    stored = _stored(NaNThroughBounds(tvm.IRModule({"main": func}))["main"])
    kept_nan, cast = sorted(stored, key=lambda v: isinstance(v, tirx.Cast))
    assert isinstance(kept_nan, tirx.Max) and isinstance(kept_nan.a, tirx.FloatImm)  # max(0, x): NaN stays NaN
    outer = cast.value  # max(min(255, x), 0): a NaN reaches the outer max, which gives 0, never the cast
    assert isinstance(outer, tirx.Max) and isinstance(outer.b, tirx.FloatImm)
    assert isinstance(outer.a, tirx.Min) and isinstance(outer.a.a, tirx.FloatImm)
