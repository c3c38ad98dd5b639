"""Quantized convolutions and matmuls (QDQ form) to integer arithmetic, rounding as onnxruntime does.

ONNX's QDQ form writes an int8 convolution as ``Conv(DequantizeLinear(xq), DequantizeLinear(wq))``
(bias ``DequantizeLinear(bq)``, maybe a ReLU) followed by a ``QuantizeLinear``; TVM imports it as
float arithmetic on dequantized tensors. Here each such convolution becomes one on the integers,
uint8 data by int8 weights summed in int32:

    conv(sx (xq - zx), sw wq) = sx sw (conv(xq, wq) - zx sum(wq))

which holds with the spatial padding too when ``zx`` is 0 (padding ``xq`` with 0 is padding ``x``
with 0); otherwise the data is padded with ``zx`` first. A depthwise or grouped convolution sums
its few products in float32 on ``xq - zx``, where every partial sum is an integer below
``FLOAT_EXACT`` (a group's weights and a bias below half of it).

The whole chain up to the ``QuantizeLinear`` becomes what onnxruntime's ``QLinearConv`` computes
(MLAS's requantization): ``clamp(round_half_even(float32(sum + bq) * m), -zy, 255 - zy) + zy`` with
``m = float32(sx * sw) / sy`` per output channel, a ReLU folded into the lower bound; so the int8
result is onnxruntime's to the bit wherever the sums are. A convolution whose chain is of another
form keeps its float epilogue after the integer sum (``sx sw`` times it, then the model's ops).
A matmul by constant weights (per column scales) is the same with ``zx`` times the weights' column
sums, ending as onnxruntime's ``QLinearMatMul``; a matmul of two computed tensors (attention) stays
in float.

Where the target's byte dot product saturates pairs of products to int16 (``vpmaddubsw``: no
VNNI), onnxruntime's kernels there do too, and the sums are made to pair the same products: an
odd number of input channels' convolution over its taps as channels (``_taps_as_channels``), a
grouped one's pairs computed apart (``_grouped_in_pairs``); what onnxruntime sums exactly there
(its depthwise kernel, ``ConvInteger``, unrequantized results, int8 activations: its int8 kernels)
is summed exactly (``_nibbles``).

Additions of two uint8 tensors become onnxruntime's ``QLinearAdd``, pointwise arithmetic on one
uint8 tensor a 256-entry table, and max pooling or reshapes at one scale run on the uint8 tensor.
Forms left in float arithmetic are counted in ``summary()`` (``report()["quantized"]``) with why.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tvm
from tvm import relax, s_tir, te, tirx

from relaxc.passes.ir import IS_SCHEDULED, OUT_ELEMWISE_FUSABLE, SCHEDULE_ATTR, constant_array, is_op, static_shape
from relaxc.passes.signed_activations import SIGNED_ATTR

_ACTIVATIONS = ("relax.nn.relu", "relax.clip")
# sums of integers below this are exact in float32: a depthwise convolution's few uint8 x int8
# products (at most 255 x 128 each) are summed in float, one FMA a tap, where int32 lanes take a
# two-uop multiply and an add (MobileNetV2 int8 ran 1.73x slower so), and the sum stays in float
FLOAT_EXACT = 1 << 24
RISKY_PAIR = 129  # |w0| + |w1| of same-sign weights from which 255 (|w0| + |w1|) leaves int16


def _scalar(expr: relax.Expr) -> float | None:
    array = constant_array(expr)
    if array is None or array.size != 1:
        return None
    return array.reshape(()).item()


@dataclass
class _Operands:
    """A convolution or matmul of dequantized uint8 data and int8 weights (zero point 0), read off
    the graph."""

    conv: relax.Call  # a conv2d or a matmul
    data: relax.Expr  # the uint8 tensor
    x_zero: int | relax.Expr  # a constant, or a scalar computed at run time (ConvInteger's)
    weights: np.ndarray  # int8, OIHW or (K, N)
    scale: np.ndarray  # float32 ``sx * sw`` per output channel

    def per_channel(self, values: np.ndarray) -> np.ndarray:
        """Values per output channel shaped to broadcast along the output's channel axis."""
        return values.reshape(-1) if is_op(self.conv, "relax.matmul") else values.reshape(1, -1, 1, 1)


@dataclass
class _Chain:
    """A quantized convolution up to the uint8 ``quantize`` of its result, in the form onnxruntime
    fuses into a ``QLinearConv``."""

    operands: _Operands
    bias: np.ndarray | None  # int32 per output channel
    relu: bool
    y_scale: float
    y_zero: int


@dataclass
class _Moved:
    """``quantize(op(dequantize(x)))`` at the same scale and zero point, ``op`` one that only moves
    or selects values (max pooling, reshapes): ``op(x)`` on the uint8 tensor itself, exactly, as
    onnxruntime runs such ops on the integers."""

    op: relax.Call
    data: relax.Expr


@dataclass
class _Averaged:
    """``quantize(pool(dequantize(x)))`` of an average pooling, as onnxruntime's int8 kernels
    compute it. Windows (``avg_pool2d``, ``QLinearAveragePool``): the dequantized values summed in
    window order and divided by the count, then ``round_half_even(average / sy + zy)``, the zero
    point added before rounding (``QuantizeLinear`` adds it after: one step apart at exact halves
    with an odd zero point). Global (``QLinearGlobalAveragePool``): ``sum(xq) - zx n`` requantized
    with ``m = sx / (sy n)`` as a convolution is."""

    pool: relax.Call
    data: relax.Expr  # the uint8 tensor
    scales: tuple[float, float]  # sx, sy
    zeros: tuple[int, int]  # zx, zy


@dataclass
class _Table:
    """A uint8 ``quantize`` of pointwise arithmetic on one uint8 tensor (a sigmoid, a SiLU's
    product): one of 256 values for each of its values, computed now; the tensor becomes a lookup
    (onnxruntime's ``QLinearSigmoid`` is such a table, its ``QLinearMul`` of ``x`` and
    ``sigmoid(x)`` one too)."""

    data: relax.Expr
    values: np.ndarray  # int32, by the data's value


def _computed_scalar(expr: relax.Expr) -> bool:
    """A scalar uint8 value computed at run time (``DynamicQuantizeLinear``'s zero point)."""
    shape = static_shape(expr)
    return constant_array(expr) is None and shape is not None and math.prod(shape) == 1 \
        and str(expr.ty.dtype) == "uint8"


def _fma(a: np.ndarray | np.float32, b: np.ndarray | np.float32, c: np.ndarray | np.float32) -> np.ndarray:
    """float32 ``a * b + c`` rounded once (the product is exact in float64)."""
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(np.float32)


# MLAS's logistic (Eigen's rational approximation), which onnxruntime's Sigmoid and its
# QLinearSigmoid tables compute on x86-64 CPUs (its FMA3 kernel): p(x^2) x / q(x^2) + 1/2
_LOGISTIC_P = np.float32([4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03,
                          2.48287947061529e-01])
_LOGISTIC_Q = np.float32([6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06, 1.70198817374094e-03,
                          1.16817656904453e-01, 9.93151921023180e-01])


def _logistic(values: np.ndarray) -> np.ndarray:
    """The sigmoid as MLAS's FMA3 kernel computes it, operation by operation: a float64 sigmoid
    rounded to float32 put 1.4 % of a quantized sigmoid's outputs one step from onnxruntime's."""
    x = np.clip(values.astype(np.float32), np.float32(-18), np.float32(18))
    square = x * x
    p, q = _fma(square, _LOGISTIC_P[0], _LOGISTIC_P[1]), _fma(square, _LOGISTIC_Q[0], _LOGISTIC_Q[1])
    for coefficient in _LOGISTIC_P[2:]:
        p = _fma(square, p, coefficient)
    for coefficient in _LOGISTIC_Q[2:]:
        q = _fma(square, q, coefficient)
    return np.maximum((x * p) / q + np.float32(0.5), np.float32(0))


_POINTWISE: dict[str, Callable[..., np.ndarray]] = {
    "relax.sigmoid": _logistic,
    "relax.tanh": lambda v: np.tanh(v.astype(np.float64)).astype(np.float32),
    "relax.erf": lambda v: np.vectorize(math.erf, otypes=[np.float64])(v.astype(np.float64)).astype(np.float32),
    "relax.nn.relu": lambda v: np.maximum(v, np.float32(0)),
    "relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
    "relax.divide": np.divide, "relax.maximum": np.maximum, "relax.minimum": np.minimum,
}
_VALUES = np.arange(256, dtype=np.uint8)


# ops for which quantize(op(dequantize(x))) is op(x) when both use one scale and zero point
_MOVES = ("relax.nn.max_pool2d", "relax.reshape")


@dataclass
class _AddChain:
    """``quantize(add(dequantize(a), dequantize(b)))`` of uint8 tensors, ``b`` of a's shape or a
    constant broadcast to it (maybe a ReLU the output's zero point 0 already implies), as onnxruntime's
    ``QLinearAdd`` computes it (a broadcast operand is its b, the inputs swapped if need be):
    ``saturate(round_half_even(a ra + (b rb + fixed)))``, ``r = s / sy`` and
    ``fixed = zy - (ra za + rb zb)``, the multiply-adds fused (MLAS's AVX2 kernel)."""

    a: relax.Expr
    b: relax.Expr
    ratios: tuple[np.float32, np.float32]
    fixed: np.float32


class _NotPointwise(Exception):
    """An expression that is not pointwise arithmetic on one uint8 tensor."""


@relax.expr_functor.visitor
class _Bindings(relax.PyExprVisitor):
    """Every variable's bound value, and how many times each is used."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[relax.Var, relax.Expr] = {}
        self.uses: collections.Counter = collections.Counter()

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        self.values[binding.var] = binding.value
        self.visit_expr(binding.value)

    def visit_var_(self, var: relax.Var) -> None:
        self.uses[var] += 1

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> None:
        self.uses[var] += 1


class _Graph:
    """The quantized convolutions of one function and the chains they end, found before any rewrite."""

    def __init__(self, func: relax.Function, refused: collections.Counter, saturated_pairs: bool) -> None:
        self.bindings = _Bindings()
        self.bindings.visit_expr(func)
        self.refused = refused
        self.saturated_pairs = saturated_pairs
        self.convs: dict[relax.Var, _Operands] = {}
        for var, value in self.bindings.values.items():
            if is_op(value, "relax.nn.conv2d") or is_op(value, "relax.matmul"):
                operands = self._operands(value)
                if operands is not None:
                    self.convs[var] = operands
        # each uint8 quantize's values as a function of one uint8 tensor, where it is one, found in
        # binding order so a later one reads an earlier one's here instead of evaluating it again
        self.forms: dict[relax.Var, tuple[relax.Expr, np.ndarray]] = {}
        self.chains: dict[relax.Var, _Chain | _AddChain | _Moved | _Averaged | _Table] = {}
        for var, value in self.bindings.values.items():
            if not is_op(value, "relax.quantize"):
                continue
            form = self._form(value)
            if form is not None:
                self.forms[var] = form
            chain = self._fused(value) or (_Table(form[0], form[1].astype(np.int32)) if form is not None and any(
                is_op(self._value(value.args[0]), op) for op in _POINTWISE) else None)
            if chain is not None:
                self.chains[var] = chain
        owned = {id(chain.operands.conv) for chain in self.chains.values() if isinstance(chain, _Chain)}
        self.alone = {var: ops for var, ops in self.convs.items() if id(ops.conv) not in owned}

    def _value(self, expr: relax.Expr) -> relax.Expr:
        return self.bindings.values.get(expr, expr) if isinstance(expr, relax.Var) else expr

    def _single(self, expr: relax.Expr) -> tuple[relax.Var, relax.Expr] | None:
        """A variable used once (a chain may own it) and its value."""
        if isinstance(expr, relax.Var) and self.bindings.uses[expr] == 1 and expr in self.bindings.values:
            return expr, self.bindings.values[expr]
        return None

    def _operands(self, call: relax.Call) -> _Operands | None:
        data, weight = (self._value(arg) for arg in call.args)
        attrs, matmul = call.attrs, is_op(call, "relax.matmul")
        transposed = matmul and is_op(weight, "relax.permute_dims") and [int(a) for a in weight.attrs.axes] == [1, 0]
        if transposed:  # a Gemm's transB
            weight = self._value(weight.args[0])
        if not is_op(data, "relax.dequantize") or not is_op(weight, "relax.dequantize"):
            return None
        xq, sx, zx = data.args
        wq, sw, zw = weight.args
        weights, scales, weight_zeros = constant_array(wq), constant_array(sw), constant_array(zw)
        if transposed and weights is not None and weights.ndim == 2:
            weights = weights.T
        x_scale, x_zero = _scalar(sx), _scalar(zx)
        if x_zero is None and not matmul and _computed_scalar(zx):
            x_zero = zx
        shape = static_shape(call)
        why = None
        if shape is None or (not matmul and (attrs.data_layout, attrs.kernel_layout) != ("NCHW", "OIHW")):
            why = "a layout other than NCHW/OIHW"
        elif matmul and (weights is None or weights.ndim != 2 or scales is None or scales.size not in (1, shape[-1])):
            why = "a matmul of two computed tensors" if weights is None else "a matmul with weights not a matrix"
        elif str(xq.ty.dtype) != "uint8":
            why = f"{xq.ty.dtype} data (uint8 only)"
        elif weights is None or weights.dtype != np.int8 or scales is None or weight_zeros is None:
            why = "weights not a constant int8 tensor with constant scales"
        elif np.any(weight_zeros != 0):
            why = "weights with a zero point other than 0"
        elif scales.size > 1 and int(weight.attrs.axis) % weights.ndim != (1 if matmul and not transposed else 0):
            why = "weights scaled along an axis other than the output channels'"
        elif x_scale is None or x_zero is None:
            why = "data with per-channel or variable scale or zero point"
        elif not matmul and _in_float(weights, int(attrs.groups), self.saturated_pairs) \
                and weights[0].size * 255 * 128 >= FLOAT_EXACT // 2:
            why = "a grouped convolution whose sums can leave float32's exact integers"
        if why is not None:
            self.refused[why] += 1
            return None
        channels = shape[-1] if matmul else shape[1]
        scale = (np.float32(x_scale) * np.broadcast_to(scales.astype(np.float32), (channels,))).astype(np.float32)
        return _Operands(call, xq, x_zero if isinstance(x_zero, relax.Expr) else int(x_zero), weights, scale)

    def _fused(self, call: relax.Call) -> _Chain | _AddChain | _Moved | _Averaged | None:
        """A ``quantize`` ending one of the forms onnxruntime fuses into one integer kernel."""
        value, y_scale, y_zero = call.args
        scale, zero = _scalar(y_scale), _scalar(y_zero)
        if str(call.attrs.out_dtype) != "uint8" or scale is None or zero is None:
            return None
        relu, bias = False, None
        node = self._single(value)
        if node is not None and any(is_op(node[1], op) for op in _MOVES):
            moved = self._value(node[1].args[0])
            if is_op(moved, "relax.dequantize") and str(moved.args[0].ty.dtype) == "uint8" \
                    and (_scalar(moved.args[1]), _scalar(moved.args[2])) == (scale, zero):
                return _Moved(node[1], moved.args[0])
        if node is not None and (is_op(node[1], "relax.nn.avg_pool2d") or _global_average(node[1])):
            source = self._value(node[1].args[0])
            if is_op(source, "relax.dequantize") and str(source.args[0].ty.dtype) == "uint8" \
                    and None not in (_scalar(source.args[1]), _scalar(source.args[2])):
                return _Averaged(node[1], source.args[0], (_scalar(source.args[1]), scale),
                                 (int(_scalar(source.args[2])), int(zero)))
        if node is not None and any(is_op(node[1], op) for op in _ACTIVATIONS):
            if is_op(node[1], "relax.clip") and not _covers(node[1], scale, zero):
                return None
            relu, node = True, self._single(node[1].args[0])
        if node is not None and is_op(node[1], "relax.add") and (not relu or zero == 0):
            added = self._added(node[1], scale, zero)
            if added is not None:
                return added
        if node is not None and is_op(node[1], "relax.add"):
            conv, added = (self._single(a) for a in node[1].args)
            if conv is None or added is None or conv[0] not in self.convs:
                return None
            bias = self._bias(added[1], self.convs[conv[0]])
            if bias is None:
                return None
            node = conv
        if node is None or node[0] not in self.convs:
            return None
        return _Chain(self.convs[node[0]], bias, relu, scale, int(zero))

    def _form(self, call: relax.Call) -> tuple[relax.Expr, np.ndarray] | None:
        """(its one uint8 source, its value at each of the source's 256 values) of a quantize of
        pointwise arithmetic on one uint8 tensor; None for any other."""
        sources: list[relax.Expr] = []
        try:
            values = self._evaluated(call, sources)
        except _NotPointwise:
            return None
        return (sources[0], values) if len(sources) == 1 else None

    def _evaluated(self, expr: relax.Expr, sources: list[relax.Expr]) -> np.ndarray:
        """``expr`` at each of the 256 values of its one uint8 source (appended to ``sources``),
        float32 as the QDQ graph defines it, a uint8 quantize's product of two dequantized values as
        onnxruntime's ``QLinearMul``; ``_NotPointwise`` where it is not such an expression."""
        value = self._value(expr)
        if constant_array(value) is not None:
            if _scalar(value) is None:
                raise _NotPointwise  # per channel: one table would not do
            return np.float32(_scalar(value))
        if is_op(value, "relax.dequantize"):
            data, scale, zero = value.args[0], _scalar(value.args[1]), _scalar(value.args[2])
            if None in (scale, zero) or str(data.ty.dtype) != "uint8":
                raise _NotPointwise
            centred = self._integers(data, sources).astype(np.int32) - np.int32(zero)
            return centred.astype(np.float32) * np.float32(scale)
        if is_op(value, "relax.quantize") and str(value.attrs.out_dtype) == "uint8":
            inner, scale, zero = value.args[0], _scalar(value.args[1]), _scalar(value.args[2])
            if None in (scale, zero):
                raise _NotPointwise
            product = self._value(inner)
            if is_op(product, "relax.multiply") and all(is_op(self._value(a), "relax.dequantize")
                                                         for a in product.args):
                return self._multiplied(product, np.float32(scale), zero, sources)
            quantized = np.rint(self._evaluated(inner, sources) / np.float32(scale)) + zero
            return np.clip(quantized, 0, 255).astype(np.uint8)
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in _POINTWISE:
            return _POINTWISE[value.op.name](*(self._evaluated(a, sources) for a in value.args)).astype(np.float32)
        if is_op(value, "relax.clip"):
            low, high = (float(v.value) for v in value.args[1:])
            return np.clip(self._evaluated(value.args[0], sources), np.float32(low), np.float32(high))
        raise _NotPointwise

    def _integers(self, data: relax.Expr, sources: list[relax.Expr]) -> np.ndarray:
        """The uint8 values of ``data`` at each value of the source: a quantize of pointwise
        arithmetic on one tensor by its form, anything else the source itself."""
        source, values = self.forms.get(data, (data, _VALUES))
        if not any(source.same_as(known) for known in sources):
            sources.append(source)
        return values

    def _multiplied(self, product: relax.Call, y_scale: np.float32, y_zero: float,
                    sources: list[relax.Expr]) -> np.ndarray:
        """MLAS's ``QLinearMul``: ``round((a - za) (b - zb) * (sa sb / sy) + zy)``, saturated."""
        (a, sa, za), (b, sb, zb) = (self._value(arg).args for arg in product.args)
        if None in (_scalar(sa), _scalar(za), _scalar(sb), _scalar(zb)) or str(a.ty.dtype) != "uint8" \
                or str(b.ty.dtype) != "uint8":
            raise _NotPointwise
        centred = [self._integers(x, sources).astype(np.int32) - np.int32(_scalar(z)) for x, z in ((a, za), (b, zb))]
        ratio = np.float32(np.float32(_scalar(sa)) * np.float32(_scalar(sb)) / y_scale)
        products = (centred[0] * centred[1]).astype(np.float32)
        return np.clip(np.rint(products * ratio + np.float32(y_zero)), 0, 255).astype(np.uint8)

    def _added(self, add: relax.Call, y_scale: float, y_zero: float) -> _AddChain | None:
        parts = [self._value(arg) for arg in add.args]
        if not all(is_op(p, "relax.dequantize") for p in parts):
            return None
        if static_shape(parts[0]) != static_shape(add):  # the broadcast operand is b, as onnxruntime swaps them
            parts.reverse()
        (a, sa, za), (b, sb, zb) = (p.args for p in parts)
        scalars = [_scalar(v) for v in (sa, za, sb, zb)]
        if any(v is None for v in scalars) or str(a.ty.dtype) != "uint8" or str(b.ty.dtype) != "uint8" \
                or static_shape(add) is None or static_shape(a) != static_shape(add) \
                or (static_shape(b) != static_shape(a) and constant_array(b) is None):
            return None  # a computed b broadcast (an attention mask) stays float: fused into the scores'
            # matmul, the integer form's epilogue made Tiled's kernel 10x slower (BERT's, 3 ms)
        sa, za, sb, zb = scalars
        ra, rb = np.float32(sa) / np.float32(y_scale), np.float32(sb) / np.float32(y_scale)
        fixed = np.float32(np.float32(y_zero) - _fma(ra, np.float32(za), rb * np.float32(zb)))
        return _AddChain(a, b, (ra, rb), fixed)

    def _bias(self, expr: relax.Expr, operands: _Operands) -> np.ndarray | None:
        """A bias ``DequantizeLinear(bq)`` at scale ``sx * sw``, as int32 ``bq``; None otherwise."""
        if is_op(expr, "relax.reshape"):
            expr = self._value(expr.args[0])
        if not is_op(expr, "relax.dequantize"):
            return None
        values, scales, zeros = (constant_array(a) for a in expr.args)
        channels = operands.scale.size
        if values is None or values.dtype != np.int32 or values.size != channels or scales is None \
                or zeros is None or np.any(zeros != 0) \
                or not np.array_equal(np.broadcast_to(scales, (channels,)), operands.scale):
            return None
        return values.reshape(channels)


@relax.expr_functor.mutator
class _IntegerConv(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, graph: _Graph, saturated_pairs: bool, exact: bool) -> None:
        super().__init__(mod)
        self.graph = graph
        self.saturated_pairs = saturated_pairs
        self.exact = exact  # every sum exact (int8 activations held as uint8)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        var = binding.var
        if var in self.graph.chains:
            new = self._built(self.graph.chains[var])
        elif var in self.graph.alone:
            operands = self.graph.alone[var]
            new = relax.op.multiply(self.builder_.normalize(self._sum(operands, exact=True)),
                                    relax.const(operands.per_channel(operands.scale)))
        else:
            super().visit_var_binding_(binding)
            return
        is_output = self.builder_.current_block_is_dataflow() and not isinstance(var, relax.DataflowVar)
        emit = self.builder_.emit_output if is_output else self.builder_.emit
        self.set_var_remap(var, emit(new, name_hint=var.name))

    def _built(self, chain: _Chain | _AddChain | _Moved | _Averaged | _Table) -> relax.Expr:
        if isinstance(chain, _Chain):
            return self._requantized(chain)
        if isinstance(chain, _Averaged):
            return self._averaged(chain)
        if isinstance(chain, _AddChain):
            return self._sum_of(chain)
        if isinstance(chain, _Table):
            indices = self.builder_.normalize(relax.op.astype(self.visit_expr(chain.data), "int32"))
            looked_up = self.builder_.normalize(relax.op.take(relax.const(chain.values), indices, axis=0,
                                                              mode="clip"))  # in range: no index check
            return relax.op.astype(looked_up, "uint8")
        return relax.Call(chain.op.op, [self.visit_expr(chain.data), *chain.op.args[1:]], chain.op.attrs)

    def _sum(self, operands: _Operands, bias: np.ndarray | None = None, exact: bool = False) -> relax.Expr:
        """``float32(conv(xq, wq) - zx sum(wq) + bias)`` (or the matmul's), the integer sum rounded
        once to float as onnxruntime rounds it. A convolution whose result is not requantized (a
        ``ConvInteger``, a float output) sums ``exact``ly, as onnxruntime computes those, also where
        the byte dot product saturates pairs (``_nibbles``)."""
        attrs, norm = operands.conv.attrs, self.builder_.normalize
        channels = operands.scale.size
        data = self.visit_expr(operands.data)
        offset = np.zeros(channels, np.int64) if bias is None else bias.astype(np.int64)
        exact = exact or self.exact
        if is_op(operands.conv, "relax.matmul"):
            offset = offset - operands.x_zero * operands.weights.astype(np.int64).sum(axis=0)
            weights = relax.const(np.ascontiguousarray(operands.weights))
            product = lambda data: norm(relax.op.matmul(data, weights, out_dtype="int32"))  # noqa: E731
            total = self._nibbles(data, product) if self.saturated_pairs and self.exact else product(data)
            if np.any(offset != 0):
                total = norm(relax.op.add(total, relax.const(offset.astype(np.int32))))
            return relax.op.astype(total, "float32")
        padding = [int(p) for p in attrs.padding]
        offset = offset.reshape(1, channels, 1, 1)
        groups = int(attrs.groups)
        pairs = self.saturated_pairs and not exact and not _depthwise(operands.weights, groups)
        if _in_float(operands.weights, groups, self.saturated_pairs):  # every partial sum exact in float32 (_operands)
            floats = norm(relax.op.astype(data, "float32"))
            if isinstance(operands.x_zero, relax.Expr) or operands.x_zero:  # xq - zx, padded with 0 as x is
                floats = norm(relax.op.subtract(floats, self._zero(operands.x_zero, "float32")))
            total = norm(relax.op.nn.conv2d(
                floats, relax.const(operands.weights.astype(np.float32)), strides=attrs.strides, padding=padding,
                dilation=attrs.dilation, groups=attrs.groups))
            if not np.any(offset):
                return total
            if operands.weights[0].size * 255 * 128 + np.abs(offset).max() < FLOAT_EXACT:
                return relax.op.add(total, relax.const(offset.astype(np.float32)))
            total = norm(relax.op.add(norm(relax.op.astype(total, "int32")), relax.const(offset.astype(np.int32))))
            return relax.op.astype(total, "float32")  # a large bias: added to the integers, rounded once
        weights = operands.weights
        sums = weights.astype(np.int64).sum(axis=(1, 2, 3)).reshape(offset.shape)
        grouped = groups > 1  # here: in pairs computed apart (_grouped_in_pairs), exact too by nibbles
        taps = (pairs and weights.shape[1] % 2 == 1 or grouped) and weights.shape[2] * weights.shape[3] > 1
        if isinstance(operands.x_zero, relax.Expr):
            data = self._padded_with(data, padding, operands.x_zero) if any(padding) else data
            padding = [0, 0, 0, 0]
        elif (operands.x_zero != 0 or taps) and any(padding):
            data = norm(relax.op.nn.pad(data, [0, 0, 0, 0, padding[0], padding[2], padding[1], padding[3]],
                                        pad_value=float(operands.x_zero)))
            padding = [0, 0, 0, 0]
        strides = [int(s) for s in attrs.strides]
        if taps:
            data, weights = self._taps_as_channels(data, weights, strides, [int(d) for d in attrs.dilation],
                                                   static_shape(operands.conv)[2:], groups)
            strides = [1, 1]

        def conv(data: relax.Expr) -> relax.Expr:
            if grouped:
                return self._grouped_in_pairs(data, weights, groups, strides)
            return norm(relax.op.nn.conv2d(
                data, relax.const(np.ascontiguousarray(weights)), strides=strides, padding=padding,
                dilation=[1, 1] if taps else attrs.dilation, out_dtype="int32"))

        total = self._nibbles(data, conv) if self.saturated_pairs and not pairs else conv(data)
        if isinstance(operands.x_zero, relax.Expr):  # zx sum(wq), a vector computed at run time
            total = norm(relax.op.subtract(total, norm(relax.op.multiply(
                self._zero(operands.x_zero, "int32"), relax.const(sums.astype(np.int32))))))
        else:
            offset = offset - operands.x_zero * sums
        if np.any(offset != 0):
            total = norm(relax.op.add(total, relax.const(offset.astype(np.int32))))
        return relax.op.astype(total, "float32")

    def _nibbles(self, data: relax.Expr, conv: Callable[[relax.Expr], relax.Expr]) -> relax.Expr:
        """``conv`` (or a matmul) of uint8 ``data`` summed exactly on a byte dot product that
        saturates pairs of products: 16 conv(data >> 4) + conv(data & 15), whose pairs stay within
        int16 (15 x 128 x 2)."""
        norm = self.builder_.normalize
        high = conv(norm(relax.op.right_shift(data, relax.const(4, "uint8"))))
        low = conv(norm(relax.op.bitwise_and(data, relax.const(15, "uint8"))))
        return norm(relax.op.add(norm(relax.op.multiply(high, relax.const(16, "int32"))), low))

    def _taps_as_channels(self, data: relax.Expr, weights: np.ndarray, strides: list[int], dilation: list[int],
                          out: tuple[int, ...], groups: int) -> tuple[relax.Expr, np.ndarray]:
        """A convolution of an odd number of input channels (an image's 3), or a grouped one, over
        padded ``data`` as a 1x1 one over its taps' channels, ordered (row, column, channel) by
        group (im2col), for a byte dot product that saturates pairs of products: onnxruntime
        flattens the taps so, so the pairs are its pairs (per tap, the third channel's product would
        pair with a padded zero: ResNet-18 then equalled onnxruntime on 73 % of its outputs, 100 %
        so). Costs ResNet-18's stem 0.5 ms on Zen 3 (the copies of the taps, 1.8 MB, and their
        blocking)."""
        rows, columns = weights.shape[2:]
        flat = weights.transpose(0, 2, 3, 1).reshape(weights.shape[0], -1, 1, 1)
        shape = static_shape(data)
        kernel = _taps(shape, str(data.ty.dtype), rows, columns, strides, dilation, out)
        taps = self.builder_.normalize(relax.call_tir(self.builder_.add_func(kernel, "taps"), [data], relax.TensorType(
            (shape[0], rows, columns, shape[1], *out), data.ty.dtype)))
        if groups > 1:  # (N, rows, columns, C, ...) to (N, groups, rows, columns, C / groups, ...)
            taps = self.builder_.normalize(relax.op.permute_dims(self.builder_.normalize(relax.op.reshape(
                taps, (shape[0], rows * columns, groups, shape[1] // groups, *out))), [0, 2, 1, 3, 4, 5]))
        return self.builder_.normalize(relax.op.reshape(taps, (shape[0], -1, *out))), flat

    def _grouped_in_pairs(self, data: relax.Expr, weights: np.ndarray, groups: int, strides: list[int]) -> relax.Expr:
        """A grouped 1x1 convolution of uint8 ``data`` summed as a byte dot product that saturates
        pairs of products does (onnxruntime's grouped convolutions without VNNI), in int32: the
        exact sum (in float32), less what saturation takes off the few pairs that can saturate.
        Only a pair of weights of one sign with |w0| + |w1| >= 129 can (255 (|w0| + |w1|) > 32767;
        of opposite signs the sum stays within 255 x 128): each such pair's product is computed
        apart (its two channels gathered, a convolution of groups of 2) and its excess over int16
        subtracted from its output channel. RegNet-X-400MF on Zen 3: 71.6 ms when every pair was
        computed apart."""
        norm = self.builder_.normalize
        outputs, depth = weights.shape[:2]
        flat = weights.reshape(outputs, depth).astype(np.int64)
        total = self._grouped_exactly(data, weights, groups, strides)
        paired = np.pad(flat, ((0, 0), (0, depth % 2))).reshape(outputs, -1, 2)
        risky = (paired[..., 0] * paired[..., 1] > 0) & (np.abs(paired).sum(axis=2) >= RISKY_PAIR)
        if not risky.any():
            return total
        output, pair = np.nonzero(risky)
        first = output // (outputs // groups) * depth + 2 * pair
        channels = np.stack([first, first + 1], axis=1).reshape(-1)
        gathered = norm(relax.op.astype(norm(relax.op.take(data, relax.const(channels.astype(np.int64)), axis=1)),
                                        "float32"))
        products = norm(relax.op.nn.conv2d(gathered, relax.const(paired[output, pair].reshape(-1, 2, 1, 1).astype(
            np.float32)), strides=strides, groups=len(output)))
        excess = norm(relax.op.subtract(products, norm(relax.op.clip(products, -32768, 32767))))
        owners = np.zeros((outputs, len(output), 1, 1), np.float32)
        owners[output, np.arange(len(output))] = 1
        lost = norm(relax.op.nn.conv2d(excess, relax.const(owners)))  # each excess to its output channel
        return norm(relax.op.subtract(total, norm(relax.op.astype(lost, "int32"))))

    def _grouped_exactly(self, data: relax.Expr, weights: np.ndarray, groups: int, strides: list[int]) -> relax.Expr:
        """The exact int32 sum of a grouped 1x1 convolution of uint8 ``data``: in float32 where
        every partial sum is an integer below ``FLOAT_EXACT``, else as its two nibbles' sums."""
        norm = self.builder_.normalize

        def summed(data: relax.Expr) -> relax.Expr:
            return norm(relax.op.astype(norm(relax.op.nn.conv2d(
                norm(relax.op.astype(data, "float32")), relax.const(weights.astype(np.float32)), strides=strides,
                groups=groups)), "int32"))

        if 255 * int(np.abs(weights).reshape(len(weights), -1).sum(axis=1).max()) < FLOAT_EXACT:
            return summed(data)
        return self._nibbles(data, summed)

    def _zero(self, zero: int | relax.Expr, dtype: str) -> relax.Expr:
        """A zero point, constant or computed at run time, as ``dtype``."""
        if not isinstance(zero, relax.Expr):
            return relax.const(np.array(zero, dtype))
        return self.builder_.normalize(relax.op.astype(self.visit_expr(zero), dtype))

    def _padded_with(self, data: relax.Expr, padding: list[int], zero: relax.Expr) -> relax.Expr:
        """``data`` padded spatially with a zero point computed at run time: padded with 0, then
        the border (a constant mask) set to ``zero``."""
        norm, (_, _, height, width) = self.builder_.normalize, static_shape(data)
        widths = [0, 0, 0, 0, padding[0], padding[2], padding[1], padding[3]]
        border = np.pad(np.zeros((1, 1, height, width), bool), [(0, 0), (0, 0), (padding[0], padding[2]),
                                                                  (padding[1], padding[3])], constant_values=True)
        padded = norm(relax.op.nn.pad(data, widths, pad_value=0.0))
        return norm(relax.op.where(relax.const(border), self.visit_expr(zero), padded))

    def _float(self, expr: relax.Expr) -> relax.Expr:
        return self.builder_.normalize(relax.op.astype(self.visit_expr(expr), "float32"))

    def _sum_of(self, chain: _AddChain) -> relax.Expr:
        (ra, rb), norm = chain.ratios, self.builder_.normalize
        b = norm(relax.op.add(norm(relax.op.multiply(self._float(chain.b), relax.const(rb))), relax.const(chain.fixed)))
        total = norm(relax.op.add(norm(relax.op.multiply(self._float(chain.a), relax.const(ra))), b))
        return _rounded(total, 0)

    def _averaged(self, chain: _Averaged) -> relax.Expr:
        norm, pool = self.builder_.normalize, chain.pool
        (x_scale, y_scale), (x_zero, y_zero) = chain.scales, chain.zeros
        if is_op(pool, "relax.mean"):
            integers = norm(relax.op.astype(self.visit_expr(chain.data), "int32"))
            total = norm(relax.op.sum(integers, axis=pool.attrs.axis, keepdims=pool.attrs.keepdims))
            count = int(np.prod(static_shape(chain.data)[2:]))
            centred = norm(relax.op.subtract(total, relax.const(np.int32(x_zero * count))))
            multiplier = np.float32(np.float32(x_scale) / (np.float32(y_scale) * np.float32(count)))
            scaled = norm(relax.op.multiply(norm(relax.op.astype(centred, "float32")), relax.const(multiplier)))
            return _rounded(scaled, y_zero)
        average = norm(_windows_as_onnxruntime(pool, self.visit_expr(pool.args[0])))
        shifted = norm(relax.op.add(norm(relax.op.divide(average, relax.const(np.float32(y_scale)))),
                                    relax.const(np.float32(y_zero))))
        return _rounded(shifted, 0)

    def _requantized(self, chain: _Chain) -> relax.Expr:
        operands = chain.operands
        multiplier = operands.per_channel((operands.scale / np.float32(chain.y_scale)).astype(np.float32))
        scaled = self.builder_.normalize(relax.op.multiply(self.builder_.normalize(self._sum(operands, chain.bias)),
                                                           relax.const(multiplier)))
        if chain.relu:
            scaled = self.builder_.normalize(relax.op.nn.relu(scaled))
        return _rounded(scaled, chain.y_zero)  # clamped after rounding, not before: one (integer bounds)


def _rounded(value: relax.Expr, zero: int) -> relax.Expr:
    """``saturate_uint8(round_half_even(value) + zero)`` as TVM's quantize at scale 1 computes it
    (Relax's own ``round`` becomes a ``nearbyint`` that made MobileNetV2's int8 kernels up to 5x as
    slow)."""
    return relax.op.quantize(value, relax.const(np.float32(1.0)), relax.const(np.uint8(zero)), axis=-1,
                             out_dtype="uint8")


def _windows_as_onnxruntime(pool: relax.Call, data: relax.Expr) -> relax.Expr:
    """``pool`` (an ``avg_pool2d``) on ``data`` as ``QLinearAveragePool`` divides: counting the
    padding, by the whole window, the last window of a ceil-mode pooling too (the float operator
    counts only its part inside the padded input), so the end padding is extended over it."""
    attrs = pool.attrs
    if not (attrs.ceil_mode and attrs.count_include_pad):
        return relax.Call(pool.op, [data], attrs)
    size, out = static_shape(pool.args[0])[2:], static_shape(pool)[2:]
    pads = [int(p) for p in attrs.padding]
    for axis in range(2):
        reach = (out[axis] - 1) * int(attrs.strides[axis]) + (int(attrs.pool_size[axis]) - 1) * \
            int(attrs.dilation[axis]) + 1
        pads[2 + axis] = max(pads[2 + axis], reach - size[axis] - pads[axis])
    return relax.op.nn.avg_pool2d(data, attrs.pool_size, attrs.strides, pads, attrs.dilation, ceil_mode=False,
                                  count_include_pad=True, layout=attrs.layout, out_layout=attrs.out_layout)


def _global_average(call: relax.Expr) -> bool:
    """Whether ``call`` is a global average pooling (imported as a mean over H and W, kept)."""
    shape = static_shape(call.args[0]) if is_op(call, "relax.mean") else None
    return shape is not None and len(shape) == 4 and bool(call.attrs.keepdims) \
        and sorted(int(a) % 4 for a in call.attrs.axis) == [2, 3]


def _covers(clip: relax.Call, scale: float, zero: float) -> bool:
    """Whether a ``clip`` before a uint8 ``quantize`` only cuts below at 0 (a ReLU6 whose top the
    quantization's range already cuts, as onnxruntime's quantizer sets it)."""
    low, high = (float(v.value) for v in clip.args[1:])
    return low == 0.0 and high >= (255 - zero) * scale


def _stats() -> dict:
    return {"convolutions": 0, "matmuls": 0, "requantized": 0, "adds": 0, "moves": 0, "averages": 0, "tables": 0,
            "float": collections.Counter()}


def _depthwise(weights: np.ndarray, groups: int) -> bool:
    """One input and one output channel a group: onnxruntime's depthwise kernel, which sums exactly."""
    return weights.shape[1] == 1 and weights.shape[0] == groups


def _in_float(weights: np.ndarray, groups: int, saturated_pairs: bool) -> bool:
    """Whether a grouped or depthwise convolution sums in float32 (exact below ``FLOAT_EXACT``): all
    but the grouped ones whose byte products pair (``_grouped_in_pairs``)."""
    return groups > 1 and not (saturated_pairs and not _depthwise(weights, groups))


def _taps(shape: tuple[int, ...], dtype: str, rows: int, columns: int, strides: list[int], dilation: list[int],
          out: tuple[int, ...]) -> tirx.PrimFunc:
    """The kernel copying the taps of a ``rows`` x ``columns`` convolution over padded NCHW data of
    ``shape``: (N, rows, columns, C, out height, out width), one output row an iteration of one
    parallel loop (scheduled here: the default rule's 8-lane tiles recomputed five divisions each,
    1.4 ms for ResNet-18's stem where this takes 0.1)."""
    data = te.placeholder(shape, dtype, "data")
    taps = te.compute((shape[0], rows, columns, shape[1], *out), lambda n, r, c, channel, y, x: data[
        n, channel, y * strides[0] + r * dilation[0], x * strides[1] + c * dilation[1]], name="taps")
    sch = s_tir.Schedule(te.create_prim_func([data, taps]))
    *outer, _ = sch.get_loops(sch.get_sblock("taps"))
    sch.parallel(sch.fuse(*outer))
    return sch.mod["main"].with_attrs({IS_SCHEDULED: True, SCHEDULE_ATTR: "taps", "op_pattern": OUT_ELEMWISE_FUSABLE})


@tvm.transform.module_pass(opt_level=0, name="relaxc.QuantizedToIntegers")
class QuantizedToIntegers:
    """Convolutions and matmuls of dequantized uint8 data and int8 weights computed on the integers,
    and quantized additions of uint8 tensors as onnxruntime's ``QLinearAdd``.

    ``summary()`` (``report()["quantized"]``): ``convolutions`` and ``matmuls`` computed on the
    integers, of which ``requantized`` end in onnxruntime's requantization, ``adds`` so computed,
    ``moves`` (max pooling, reshapes) run on uint8, ``averages`` (average pooling) rounded as
    onnxruntime's int8 pooling rounds, ``tables``: pointwise arithmetic looked up, and
    ``float`` the quantized convolutions and matmuls left in float arithmetic, counted by why."""

    report_key = "quantized"

    def __init__(self, saturated_pairs: bool = False) -> None:
        self.saturated_pairs = saturated_pairs  # the target's byte dot saturates pairs of products (vpmaddubsw)
        self.stats = _stats()

    def summary(self) -> dict:
        return {**self.stats, "float": dict(self.stats["float"])}

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.stats = _stats()

        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                rewriter = _IntegerConv(mod.clone(), self._graph(func), self.saturated_pairs,
                                        bool(mod.attrs and mod.attrs.get(SIGNED_ATTR)))
                rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
                mod = rewriter.builder_.get()  # with the kernels it added (taps)
        return relax.transform.DeadCodeElimination()(mod)

    def _graph(self, func: relax.Function) -> _Graph:
        """``func``'s quantized chains, counted in the summary."""
        graph = _Graph(func, self.stats["float"], self.saturated_pairs)
        kinds = collections.Counter(type(chain) for chain in graph.chains.values())
        matmuls = sum(is_op(ops.conv, "relax.matmul") for ops in graph.convs.values())
        self.stats["convolutions"] += len(graph.convs) - matmuls
        self.stats["matmuls"] += matmuls
        self.stats["requantized"] += kinds[_Chain]
        self.stats["adds"] += kinds[_AddChain]
        self.stats["moves"] += kinds[_Moved]
        self.stats["averages"] += kinds[_Averaged]
        self.stats["tables"] += kinds[_Table]
        return graph
