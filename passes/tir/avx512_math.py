"""AVX-512 sigmoid: the 16-lane float32 ``sigmoid`` of kernels built for an AVX-512 target, with the
instructions that portable arithmetic cannot name.

Why a pass and not part of ``passes/tir/fast_math.py``: TVM calls the intrinsic-lowering hook that
fast_math plugs into without the target, so that lowering can only emit portable arithmetic (27
vector instructions for a sigmoid). This pass runs in relaxc's TIR pipeline after vectorisation,
where each kernel carries its target, and rewrites the ``sigmoid`` calls of kernels whose target has
``avx512f`` and whose vectors are 16 float32 lanes (what a blocked kernel with 16-lane blocks
vectorises to). Other calls keep fast_math's form. Swish (``x * sigmoid(x)``) is about a third of
EfficientNet-B0's time: its 1x1 conv 16->96 on 112x112 went 0.56 -> 0.42 ms with this form.

The algorithm is XNNPACK's ``avx512f-rr1-lut16-p3-perm-scalef-nr1fma`` sigmoid, 17 instructions:
on z = -|x|, exp(z) as 2**(n/16) from a 16-entry table held in one register (``vpermps``), a degree-3
polynomial on the reduced argument, and ``vscalefps`` for the power of two (subnormal and zero
results come out right, so no cut-off select); then 1 / (1 + e) from ``vrcp14ps`` and one
Newton-Raphson step, giving sigmoid(|x|) for x > 0 and e / (1 + e) otherwise. Error: 4 ulp on
normal results, relative 2.9e-7 (fast_math's form: 2 ulp); NaN, +-inf and signs exact
(``docs/fast_math.md``, ``tools/experiments/fast_math.py``).
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx
from tvm.target import Target

from relaxc.passes.tir.fast_math import LOG2E
from relaxc.support.targets import has_feature

LANES = 16
FLOAT, INT = f"float32x{LANES}", f"int32x{LANES}"
ALL_LANES = -1  # the int16 write mask of a masked AVX-512 intrinsic
CURRENT_ROUNDING = 4  # _MM_FROUND_CUR_DIRECTION

TABLE = [float(np.float32(2.0 ** (k / LANES))) for k in range(LANES)]  # 2**(k/16), indexed by n's low bits
MAGIC_BIAS = float.fromhex("0x1.8p19")  # z log2 e + 1.5 * 2**19 keeps 4 fraction bits of n: the table index
MINUS_LN2 = -float.fromhex("0x1.62E430p-1")
EXP_POLY = (float.fromhex("0x1.55559Ap-3"), float.fromhex("0x1.00021Ep-1"))  # e**t ~ 1 + t + c2 t^2 + c3 t^3
LOW = -104.0  # e**z rounds to 0 below; the clamp keeps the reduced argument small for huge |x|


def _splat(value: float) -> tirx.PrimExpr:
    return tirx.Broadcast(tirx.const(value, "float32"), LANES)


def _table() -> tirx.PrimExpr:
    return tirx.Shuffle([tirx.const(v, "float32") for v in TABLE], [tirx.IntImm("int32", k) for k in range(LANES)])


def _intrinsic(name: str, *args: tirx.PrimExpr) -> tirx.PrimExpr:
    return tirx.call_llvm_pure_intrin(FLOAT, name, *args)


def sigmoid(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """sigmoid of 16 float32 lanes (see the module docstring)."""
    z = -tirx.abs(x)
    z = tirx.Select(z < LOW, _splat(LOW), z)  # NaN compares false and stays NaN
    biased = z * LOG2E + MAGIC_BIAS
    power = _intrinsic("llvm.x86.avx512.permvar.sf.512", _table(), tirx.reinterpret(INT, biased))
    n = biased - MAGIC_BIAS
    t = n * MINUS_LN2 + z
    p = t * ((t * EXP_POLY[0] + EXP_POLY[1]) * t) + t
    p = power * p + power
    e = _intrinsic("llvm.x86.avx512.mask.scalef.ps.512", p, n, _splat(0.0),
                   tirx.const(ALL_LANES, "int16"), tirx.const(CURRENT_ROUNDING, "int32"))
    d = e + 1.0
    r = _intrinsic("llvm.x86.avx512.rcp14.ps.512", d, _splat(0.0), tirx.const(ALL_LANES, "int16"))
    r = (1.0 - r * d) * r + r  # one Newton-Raphson step: 2**-14 -> about 2**-28
    return tirx.Select(x > 0.0, r, e * r)


def applies(target: Target | None) -> bool:
    return target is not None and target.kind.name == "llvm" and has_feature("avx512f", target)


def _rewrite(call: tvm.ir.Call) -> tirx.PrimExpr:
    if getattr(call.op, "name", None) == "tirx.sigmoid" and str(call.ty.dtype) == FLOAT:
        return sigmoid(call.args[0])
    return call


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="relaxc.Avx512Sigmoid")
def Avx512Sigmoid(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tirx.PrimFunc:
    """16-lane float32 sigmoid calls of AVX-512 kernels become the AVX-512 form."""
    target = func.attrs.get("target") if func.attrs else None
    return tvm_ffi.structural_map(func, (tvm.ir.Call, _rewrite)) if applies(target) else func
