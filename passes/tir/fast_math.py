"""Vectorisable float32 transcendental functions for LLVM CPU code: exp, log, tanh, erf (hence
sigmoid, softmax, both GELU forms, swish, softplus, mish) and ``pow`` with a small exponent in whole
quarters.

TVM 0.27 lowers ``exp``, ``log`` and ``pow`` to LLVM intrinsics and ``erf`` to a libm call; without a vector
math library LLVM turns each into one scalar call per element, so a vectorised GELU or softmax ran
at scalar speed (GPT-2's tanh-GELU kernel was 46 % of its time). Here they become polynomial
expressions of plain arithmetic, bit operations and selects, which vectorise like any other
arithmetic. They are registered as TVM's intrinsic lowering for the ``llvm`` target, so every
kernel gets them, whichever op, rule, tuning record or importer made it; other dtypes keep TVM's own
lowering. ``register()`` installs them for the process (the pipeline and the tuning builder call it).

Accuracy, measured against numpy in float64 over every float32 bit pattern class (``docs/fast_math.md``;
``tests/passes/tir/test_fast_math.py`` asserts the bounds):
- exp: Cephes' degree-6 polynomial on the reduced argument, the power of two applied as two
  exponent-field scalings so that overflow gives inf and underflow gives subnormals then 0;
- log: Cephes' degree-8 polynomial in m - 1 for x = m 2**e, m in [sqrt(1/2), sqrt(2)) read from the
  bits (subnormals scaled by 2**23 first), plus e ln 2; 1 ulp; log(0) = -inf, log(x < 0) = NaN;
- sigmoid: on -|x| (XNNPACK's form), exp of a non-positive argument (the power of two from the
  rounding's own bits), then e / (1 + e) by Newton-Raphson from a linear estimate (the denominator
  lies in [1, 2]) with a final correction of the quotient, and 1 - that for positive x: no division
  instruction (a vector division costs several times an FMA); 0 below ln(FLT_MIN), where the
  result is subnormal. 25 vector instructions, about a third of EfficientNet-B0's time is swish;
- tanh: Eigen's rational approximation (odd degree 13 / even degree 6), clamped to +-7.905;
  |x| < 4e-4 returns x and |x| > 9 returns +-1;
- erf: Eigen's rational approximation (degree 13 / degree 8), clamped to +-4;
- NaN in, NaN out; +-inf give the limits; ``pow(x, n)`` for a constant n, |n| <= 4, that is a
  whole number of quarters is repeated multiplication by x, sqrt(x) and sqrt(sqrt(x)) (1/x^|n| for
  negative n; LRN's x^0.75, scalar ``powf`` calls at 2-7 % of the kernels' roofline before), other
  exponents keep TVM's lowering.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import tvm
import tvm_ffi
from tvm import tirx

PRIORITY = 100  # above TVM's own rules (level 10 and 99)

LOG2E = 1.44269504088896341
LN2_HI = 0.693359375  # ln 2 split in two so that n * LN2_HI is exact
LN2_LO = -2.12194440e-4
EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
EXP_LOW, EXP_HIGH = -104.0, 88.8  # exp(-104) rounds to 0, exp(88.8) overflows: clamping changes neither

SIGMOID_LOW = -87.33654475  # ln(FLT_MIN): sigmoid below it is subnormal (flushed to 0), above it exp stays normal
# sigmoid's exp(z), z <= 0, reads n = round(z log2 e) from the mantissa of z log2 e + 1.5 * 2**23 (plus
# the exponent bias 127, so that those bits shifted into the exponent field are 2**n), as XNNPACK's
# sigmoid kernels do: no rounding or conversion instruction. (Their degree-5 polynomial measured
# 3 ulp here; Cephes' above, evaluated as scale + (r scale) (1 + r P(r)), keeps 2.)
MAGIC_BIAS = float.fromhex("0x1.8000FEp23")
RECIPROCAL_ESTIMATE = (24.0 / 17.0, -8.0 / 17.0)  # 1/d on [1, 2] within 1/17 (the minimax line)
NEWTON_STEPS = 2  # relative error 1/17 -> 3.5e-3 -> 1.2e-5, then the quotient's correction squares it

TANH_CLAMP = 7.90531110763549805
TANH_TINY = 4e-4
TANH_ONE = 9.0  # beyond it float32 tanh is exactly +-1 (the clamped ratio is 2 ulp short of it)
TANH_NUM = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
            1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)
TANH_DEN = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)

ERF_CLAMP = 4.0
ERF_NUM = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
           -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
ERF_DEN = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
           -1.42647390514189e-02)

LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
            -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)
SQRT_HALF = 0.707106781186547524
FLT_MIN = float.fromhex("0x1p-126")
SUBNORMAL_SCALE = 23  # a subnormal times 2**23 is normal

MAX_POW_MULTIPLICATIONS = 4


def _lanes(x: tirx.PrimExpr) -> int:
    return tvm.DataType(str(x.ty.dtype)).lanes


def _vector(scalar: str, lanes: int) -> str:
    """The dtype of ``lanes`` values of ``scalar`` (the scalar itself for one lane)."""
    return scalar if lanes == 1 else f"{scalar}x{lanes}"


def _is_float32(x: tirx.PrimExpr) -> bool:
    dtype = tvm.DataType(str(x.ty.dtype))
    return dtype.type_code == tvm.DataTypeCode.FLOAT and dtype.bits == 32


def _like(x: tirx.PrimExpr, value: float, scalar: str = "float32") -> tirx.PrimExpr:
    """The ``scalar`` constant ``value`` with x's vector lanes."""
    constant = tirx.const(value, scalar)
    return constant if _lanes(x) == 1 else tirx.Broadcast(constant, _lanes(x))


def _horner(x: tirx.PrimExpr, coefficients: Sequence[float]) -> tirx.PrimExpr:
    result = _like(x, coefficients[0])
    for c in coefficients[1:]:
        result = result * x + c
    return result


def _clamp(x: tirx.PrimExpr, low: float, high: float) -> tirx.PrimExpr:
    return tirx.max(tirx.min(x, high), low)


def _keep_nan(x: tirx.PrimExpr, result: tirx.PrimExpr) -> tirx.PrimExpr:
    """``result``, or x where x is NaN (min/max clamps would have turned NaN into a number)."""
    return tirx.Select(tirx.isnan(x), x, result)


def _power_of_two(n: tirx.PrimExpr, lanes: int) -> tirx.PrimExpr:
    """2**n as float32 for integer-valued n in [-126, 127], built in the exponent field."""
    return tirx.reinterpret(_vector("float32", lanes), (n.astype(_vector("int32", lanes)) + 127) * (1 << 23))


def exp(x: tirx.PrimExpr) -> tirx.PrimExpr:
    lanes = _lanes(x)
    clamped = _clamp(x, EXP_LOW, EXP_HIGH)
    n = tirx.floor(clamped * LOG2E + 0.5)
    r = clamped - n * LN2_HI - n * LN2_LO
    p = _horner(r, EXP_POLY) * r * r + r + 1.0
    half = tirx.floor(n * 0.5)  # two factors of 2**(n/2): both stay normal from 2**-150 to 2**128
    return _keep_nan(x, p * _power_of_two(half, lanes) * _power_of_two(n - half, lanes))


def _quotient(e: tirx.PrimExpr, d: tirx.PrimExpr) -> tirx.PrimExpr:
    """e / d for d in [1, 2] without a division: Newton-Raphson on 1/d, then one correction of the
    quotient itself (Markstein), which makes it as accurate as the division."""
    y = _like(d, RECIPROCAL_ESTIMATE[0]) + d * RECIPROCAL_ESTIMATE[1]
    for _ in range(NEWTON_STEPS):
        y = y + y * (1.0 - d * y)
    q = e * y
    return q + y * (e - d * q)


def _exp_nonpositive(z: tirx.PrimExpr) -> tirx.PrimExpr:
    """exp(z) for z in [ln(FLT_MIN), 0] (below, garbage the caller masks)."""
    lanes = _lanes(z)
    biased = z * LOG2E + MAGIC_BIAS
    scale = tirx.reinterpret(_vector("float32", lanes), tirx.reinterpret(_vector("int32", lanes), biased) << 23)  # 2**n
    n = biased - MAGIC_BIAS
    r = z - n * LN2_HI - n * LN2_LO
    return (r * scale) * _horner(r, EXP_POLY + (1.0,)) + scale


def sigmoid(x: tirx.PrimExpr) -> tirx.PrimExpr:
    z = -tirx.abs(x)  # NaN stays NaN through every step, and no select below picks another value
    e = _exp_nonpositive(z)
    f = tirx.Select(z < SIGMOID_LOW, _like(x, 0.0), _quotient(e, e + 1.0))  # sigmoid(z), subnormal -> 0
    return tirx.Select(x > 0.0, 1.0 - f, f)


def tanh(x: tirx.PrimExpr) -> tirx.PrimExpr:
    clamped = _clamp(x, -TANH_CLAMP, TANH_CLAMP)
    x2 = clamped * clamped
    ratio = clamped * (_horner(x2, TANH_NUM) / _horner(x2, TANH_DEN))  # x last: no subnormal in between
    saturated = tirx.Select(x > 0.0, _like(x, 1.0), _like(x, -1.0))
    result = tirx.Select(tirx.abs(x) < TANH_TINY, x, tirx.Select(tirx.abs(x) > TANH_ONE, saturated, ratio))
    return _keep_nan(x, result)


def erf(x: tirx.PrimExpr) -> tirx.PrimExpr:
    clamped = _clamp(x, -ERF_CLAMP, ERF_CLAMP)
    x2 = clamped * clamped
    return _keep_nan(x, clamped * (_horner(x2, ERF_NUM) / _horner(x2, ERF_DEN)))


def log(x: tirx.PrimExpr) -> tirx.PrimExpr:
    lanes = _lanes(x)
    tiny = x < FLT_MIN
    bits = tirx.reinterpret(_vector("int32", lanes), tirx.Select(tiny, x * float(1 << SUBNORMAL_SCALE), x))
    bias = tirx.Select(tiny, _like(x, 126 + SUBNORMAL_SCALE, "int32"), _like(x, 126, "int32"))
    exponent = (bits >> 23) - bias  # x = m 2**exponent, m in [0.5, 1)
    m = tirx.reinterpret(_vector("float32", lanes), (bits & 0x007FFFFF) | 0x3F000000)
    small = m < SQRT_HALF  # then x = 2m 2**(exponent - 1): the mantissa in [sqrt(1/2), sqrt(2))
    e = exponent.astype(_vector("float32", lanes)) - tirx.Select(small, _like(x, 1.0), _like(x, 0.0))
    f = tirx.Select(small, m + m, m) - 1.0
    z = f * f
    result = f + (f * z * _horner(f, LOG_POLY) + e * LN2_LO - z * 0.5) + e * LN2_HI
    zero, inf = _like(x, 0.0), _like(x, float("inf"))
    result = tirx.Select(x == zero, -inf, tirx.Select(x == inf, inf, result))
    return tirx.Select(x < zero, _like(x, float("nan")), _keep_nan(x, result))


def _quarters(value: tirx.PrimExpr) -> int | None:
    """4 x the exponent, for a constant exponent that is a whole number of quarters, not 0, at most
    ``MAX_POW_MULTIPLICATIONS`` in size; else None."""
    if isinstance(value, tirx.Broadcast):
        value = value.value
    if isinstance(value, tirx.FloatImm) and float(4 * value.value).is_integer() \
            and 0 < abs(value.value) <= MAX_POW_MULTIPLICATIONS:
        return int(4 * value.value)
    return None


def _root(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """sqrt(x) as ``pow(x, 0.5)`` defines it at the signed limits: pow(-0, 0.5) = +0, pow(-inf, 0.5) = +inf."""
    zero, inf = _like(x, 0.0), _like(x, float("inf"))
    return tirx.Select(x == zero, zero, tirx.Select(x == -inf, inf, tirx.sqrt(x)))


def _rule(function: Callable[[tirx.PrimExpr], tirx.PrimExpr], fallback) -> Callable:
    def lower(call: tirx.Call) -> tirx.PrimExpr:
        x = call.args[0]
        return function(x) if _is_float32(x) else fallback(call)
    return lower


def _pow_rule(fallback) -> Callable:
    def lower(call: tirx.Call) -> tirx.PrimExpr:
        base, exponent = call.args
        quarters = _quarters(exponent)
        if quarters is None or not _is_float32(base):
            return fallback(call)
        whole, fraction = divmod(abs(quarters), 4)  # x^(q/4) = x^whole sqrt(x)^(fraction >> 1) x^(1/4)^(fraction & 1)
        factors = [base] * whole
        if fraction:  # x on |x|: a root of x < 0 is NaN, but (-0)^1.5 is +0 and (-inf)^1.5 +inf
            root = _root(base)
            factors = [tirx.abs(base)] * whole + [root] * (fraction >> 1) + [tirx.sqrt(root)] * (fraction & 1)
        product = factors[0]
        for factor in factors[1:]:
            product = product * factor
        return product if quarters > 0 else 1.0 / product
    return lower


def _default_rule(op: str) -> Callable:
    """TVM's own lowering (or, for sigmoid, legalisation) of ``op`` for LLVM, which other dtypes keep."""
    attrs = ("llvm.FLowerIntrinsic", "default.FLowerIntrinsic", "default.FLegalize")
    return next(rule for rule in map(tvm.ir.Op.get(op).get_attr, attrs) if rule is not None)


EXPANSIONS = {"tirx.exp": exp, "tirx.log": log, "tirx.tanh": tanh, "tirx.erf": erf,  # written out in full
              "tirx.sigmoid": sigmoid}


def register() -> None:
    """Make these the LLVM lowering of exp, tanh, erf, sigmoid and pow (idempotent)."""
    if getattr(register, "done", False):
        return
    for op, function in EXPANSIONS.items():
        tirx.register_intrin_lowering(op, "llvm", f=_rule(function, _default_rule(op)), level=PRIORITY)
    tirx.register_intrin_lowering("tirx.pow", "llvm", f=_pow_rule(_default_rule("tirx.pow")), level=PRIORITY)
    register.done = True


@functools.cache
def operations(op: str) -> int:
    """The arithmetic of one float32 call of ``op`` as expanded here: each distinct operation once
    (a multiply and an add count two, as in FLOPs). exp is 38, sigmoid 48."""
    distinct: set[int] = set()

    def note(node: object) -> object:
        if isinstance(node, tirx.Expr) and not isinstance(node, (tirx.Var, tirx.IntImm, tirx.FloatImm, tirx.Broadcast)):
            distinct.add(tvm_ffi.structural_hash(node))
        return node

    tvm_ffi.structural_map(EXPANSIONS[op](tirx.Var("x", "float32")), note)
    return len(distinct)


def expanded(expr: object) -> bool:
    """Whether ``expr`` is a call of a function that the lowering here writes out in full."""
    return isinstance(expr, tvm.ir.Call) and getattr(expr.op, "name", None) in EXPANSIONS


def _contains(expr: tirx.PrimExpr, kind: type, wanted: Callable[[object], bool] = lambda _: True) -> bool:
    """Whether ``expr`` holds a node of ``kind`` that is ``wanted`` (Python sees only nodes of ``kind``)."""
    found = []
    tvm_ffi.structural_map(expr, (kind, lambda node: found.append(node) or node if wanted(node) else node))
    return bool(found)


def _in_a_branch(expr: tirx.PrimExpr) -> bool:
    """Whether an expanded call sits in a branch of an ``if_then_else`` (evaluated only if taken)."""
    return _contains(expr, tvm.ir.Call, lambda node: getattr(node.op, "name", None) == "tirx.if_then_else"
                     and any(_contains(arg, tvm.ir.Call, expanded) for arg in node.args[1:]))


def _bind_arguments(store: tirx.BufferStore) -> tirx.Stmt:
    if not _contains(store.value, tvm.ir.Call, expanded) or _contains(store.value, tirx.Let) \
            or _in_a_branch(store.value):
        return store
    binds: list[tirx.Stmt] = []

    def bind(call: tvm.ir.Call) -> tirx.PrimExpr:
        argument = call.args[0] if expanded(call) else None
        if argument is None or isinstance(argument, (tirx.Var, tirx.FloatImm, tvm.ir.TensorLoad)):
            return call
        var = tirx.Var(f"{call.op.name[5:]}_arg", argument.ty)
        binds.append(tirx.LetStmt(var, argument))
        return tirx.call_intrin(str(call.ty.dtype), call.op, var, *call.args[1:])

    value = tvm_ffi.structural_map(store.value, (tvm.ir.Call, bind))
    return tirx.SeqStmt([*binds, tirx.BufferStore(store.buffer, value, store.indices)]) if binds else store


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="relaxc.BindExpandedArguments")
def BindExpandedArguments(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tirx.PrimFunc:
    """The argument of each call these functions expand (and the AVX-512 sigmoid) bound to a variable
    first: an expansion reads its argument several times, and an argument that is itself an
    expansion (sigmoid(sigmoid(x)), a fuzzed graph's) made lowering one kernel grow past 21 GB.
    Calls in a branch of an ``if_then_else`` are left where they are (evaluated only when taken)."""
    return tvm_ffi.structural_map(func, (tirx.BufferStore, _bind_arguments))
