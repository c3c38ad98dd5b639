"""Quantized convolutions (QDQ form) to integer arithmetic, rounding as onnxruntime does.

ONNX's QDQ form writes an int8 convolution as ``Conv(DequantizeLinear(xq), DequantizeLinear(wq))``
(bias ``DequantizeLinear(bq)``, maybe a ReLU) followed by a ``QuantizeLinear``; TVM imports it as
float arithmetic on dequantized tensors. Here each such convolution becomes one on the integers,
uint8 data by int8 weights summed in int32:

    conv(sx (xq - zx), sw wq) = sx sw (conv(xq, wq) - zx sum(wq))

which holds with the spatial padding too when ``zx`` is 0 (padding ``xq`` with 0 is padding ``x``
with 0); otherwise the data is padded with ``zx`` first.

The whole chain up to the ``QuantizeLinear`` becomes what onnxruntime's ``QLinearConv`` computes
(MLAS's requantization): ``clamp(round_half_even(float32(sum + bq) * m), -zy, 255 - zy) + zy`` with
``m = float32(sx * sw) / sy`` per output channel, a ReLU folded into the lower bound; so the int8
result is onnxruntime's to the bit wherever the sums are. A convolution whose chain is of another
form keeps its float epilogue after the integer sum (``sx sw`` times it, then the model's ops).

Forms left in float arithmetic are counted in ``summary()`` (``report()["quantized"]``) with why.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from relaxc.passes.ir import constant_array, is_op, map_relax_functions, static_shape

_ACTIVATIONS = ("relax.nn.relu", "relax.clip")


def _scalar(expr: relax.Expr) -> float | None:
    array = constant_array(expr)
    if array is None or array.size != 1:
        return None
    return array.reshape(()).item()


@dataclass
class _Operands:
    """A convolution of dequantized uint8 data and int8 weights (zero point 0), read off the graph."""

    conv: relax.Call
    data: relax.Expr  # the uint8 tensor
    x_scale: float
    x_zero: int
    weights: np.ndarray  # int8, OIHW
    scale: np.ndarray  # float32 ``sx * sw`` per output channel


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


# ops for which quantize(op(dequantize(x))) is op(x) when both use one scale and zero point
_MOVES = ("relax.nn.max_pool2d", "relax.reshape")


@dataclass
class _AddChain:
    """``quantize(add(dequantize(a), dequantize(b)))`` of uint8 tensors of one shape (maybe a ReLU
    the output's zero point 0 already implies), as onnxruntime's ``QLinearAdd`` computes it:
    ``saturate(round_half_even(a ra + (b rb + fixed)))``, ``r = s / sy`` and
    ``fixed = zy - (ra za + rb zb)``, the multiply-adds fused (MLAS's AVX2 kernel)."""

    a: relax.Expr
    b: relax.Expr
    ratios: tuple[np.float32, np.float32]
    fixed: np.float32


def _fma(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


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

    def __init__(self, func: relax.Function, refused: collections.Counter) -> None:
        self.bindings = _Bindings()
        self.bindings.visit_expr(func)
        self.refused = refused
        self.convs: dict[relax.Var, _Operands] = {}
        for var, value in self.bindings.values.items():
            if is_op(value, "relax.nn.conv2d"):
                operands = self._operands(value)
                if operands is not None:
                    self.convs[var] = operands
        self.chains = {var: chain for var, value in self.bindings.values.items()
                       if is_op(value, "relax.quantize") and (chain := self._chain(value)) is not None}
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
        if not is_op(data, "relax.dequantize") or not is_op(weight, "relax.dequantize"):
            return None
        attrs = call.attrs
        xq, sx, zx = data.args
        wq, sw, zw = weight.args
        weights, scales, weight_zeros = constant_array(wq), constant_array(sw), constant_array(zw)
        x_scale, x_zero = _scalar(sx), _scalar(zx)
        shape = static_shape(call)
        why = None
        if (attrs.data_layout, attrs.kernel_layout) != ("NCHW", "OIHW") or shape is None:
            why = "a layout other than NCHW/OIHW"
        elif str(xq.ty.dtype) != "uint8":
            why = f"{xq.ty.dtype} data (uint8 only)"
        elif weights is None or weights.dtype != np.int8 or scales is None or weight_zeros is None:
            why = "weights not a constant int8 tensor with constant scales"
        elif np.any(weight_zeros != 0):
            why = "weights with a zero point other than 0"
        elif x_scale is None or x_zero is None:
            why = "data with per-channel or variable scale or zero point"
        elif int(attrs.groups) != 1:  # depthwise: summed in int32 lanes MobileNetV2 ran 1.7x slower than in float
            why = "a grouped or depthwise convolution"
        if why is not None:
            self.refused[why] += 1
            return None
        channels = shape[1]
        scale = (np.float32(x_scale) * np.broadcast_to(scales.astype(np.float32), (channels,))).astype(np.float32)
        return _Operands(call, xq, x_scale, int(x_zero), weights, scale)

    def _chain(self, call: relax.Call) -> _Chain | _AddChain | _Moved | None:
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

    def _added(self, add: relax.Call, y_scale: float, y_zero: float) -> _AddChain | None:
        parts = [self._value(arg) for arg in add.args]
        if not all(is_op(p, "relax.dequantize") for p in parts):
            return None
        (a, sa, za), (b, sb, zb) = (p.args for p in parts)
        scalars = [_scalar(v) for v in (sa, za, sb, zb)]
        if any(v is None for v in scalars) or str(a.ty.dtype) != "uint8" or str(b.ty.dtype) != "uint8" \
                or static_shape(a) is None or static_shape(a) != static_shape(b):
            return None
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
    def __init__(self, mod: tvm.IRModule, graph: _Graph) -> None:
        super().__init__(mod)
        self.graph = graph

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        var = binding.var
        if var in self.graph.chains:
            new = self._built(self.graph.chains[var])
        elif var in self.graph.alone:
            operands = self.graph.alone[var]
            floats = relax.op.astype(self._sum(operands), "float32")
            new = relax.op.multiply(self.builder_.normalize(floats), relax.const(operands.scale.reshape(1, -1, 1, 1)))
        else:
            super().visit_var_binding_(binding)
            return
        is_output = self.builder_.current_block_is_dataflow() and not isinstance(var, relax.DataflowVar)
        emit = self.builder_.emit_output if is_output else self.builder_.emit
        self.set_var_remap(var, emit(new, name_hint=var.name))

    def _built(self, chain: _Chain | _AddChain | _Moved) -> relax.Expr:
        if isinstance(chain, _Chain):
            return self._requantized(chain)
        if isinstance(chain, _AddChain):
            return self._sum_of(chain)
        return relax.Call(chain.op.op, [self.visit_expr(chain.data), *chain.op.args[1:]], chain.op.attrs)

    def _sum(self, operands: _Operands, bias: np.ndarray | None = None) -> relax.Expr:
        """The int32 sum ``conv(xq, wq) - zx sum(wq) (+ bias)``."""
        attrs = operands.conv.attrs
        channels = operands.scale.size
        data = self.visit_expr(operands.data)
        padding = [int(p) for p in attrs.padding]
        if operands.x_zero != 0 and any(padding):
            data = self.builder_.normalize(relax.op.nn.pad(
                data, [0, 0, 0, 0, padding[0], padding[2], padding[1], padding[3]], pad_value=float(operands.x_zero)))
            padding = [0, 0, 0, 0]
        total = self.builder_.normalize(relax.op.nn.conv2d(
            data, relax.const(np.ascontiguousarray(operands.weights)), strides=attrs.strides, padding=padding,
            dilation=attrs.dilation, out_dtype="int32"))
        offset = -operands.x_zero * operands.weights.astype(np.int64).sum(axis=(1, 2, 3))
        if bias is not None:
            offset = offset + bias
        if np.any(offset != 0):
            total = self.builder_.normalize(relax.op.add(total, relax.const(offset.astype(np.int32).reshape(1, channels, 1, 1))))
        return total

    def _float(self, expr: relax.Expr) -> relax.Expr:
        return self.builder_.normalize(relax.op.astype(self.visit_expr(expr), "float32"))

    def _sum_of(self, chain: _AddChain) -> relax.Expr:
        (ra, rb), norm = chain.ratios, self.builder_.normalize
        b = norm(relax.op.add(norm(relax.op.multiply(self._float(chain.b), relax.const(rb))), relax.const(chain.fixed)))
        total = norm(relax.op.add(norm(relax.op.multiply(self._float(chain.a), relax.const(ra))), b))
        return relax.op.astype(norm(relax.op.clip(norm(relax.op.round(total)), 0.0, 255.0)), "uint8")

    def _requantized(self, chain: _Chain) -> relax.Expr:
        operands = chain.operands
        multiplier = (operands.scale / np.float32(chain.y_scale)).astype(np.float32).reshape(1, -1, 1, 1)
        floats = relax.op.astype(self._sum(operands, chain.bias), "float32")
        scaled = relax.op.multiply(self.builder_.normalize(floats), relax.const(multiplier))
        low = float(max(-chain.y_zero, 0) if chain.relu else -chain.y_zero)
        clamped = relax.op.clip(self.builder_.normalize(scaled), low, float(255 - chain.y_zero))
        rounded = relax.op.add(self.builder_.normalize(relax.op.round(self.builder_.normalize(clamped))),
                               relax.const(np.float32(chain.y_zero)))
        return relax.op.astype(self.builder_.normalize(rounded), "uint8")


def _covers(clip: relax.Call, scale: float, zero: float) -> bool:
    """Whether a ``clip`` before a uint8 ``quantize`` only cuts below at 0 (a ReLU6 whose top the
    quantization's range already cuts, as onnxruntime's quantizer sets it)."""
    low, high = (float(v.value) for v in clip.args[1:])
    return low == 0.0 and high >= (255 - zero) * scale


def _stats() -> dict:
    return {"convolutions": 0, "requantized": 0, "adds": 0, "moves": 0, "float": collections.Counter()}


@tvm.transform.module_pass(opt_level=0, name="relaxc.IntegerConvolutions")
class IntegerConvolutions:
    """Convolutions of dequantized uint8 data and int8 weights computed on the integers, and
    quantized additions of uint8 tensors as onnxruntime's ``QLinearAdd``.

    ``summary()`` (``report()["quantized"]``): ``convolutions`` computed on the integers, of which
    ``requantized`` end in onnxruntime's requantization, ``adds`` so computed, ``moves`` (max
    pooling, reshapes) run on uint8, and ``float`` the quantized convolutions left in float
    arithmetic, counted by why."""

    report_key = "quantized"

    def __init__(self) -> None:
        self.stats = _stats()

    def summary(self) -> dict:
        return {**self.stats, "float": dict(self.stats["float"])}

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.stats = _stats()

        def rewrite(func: relax.Function) -> relax.Function:
            graph = _Graph(func, self.stats["float"])
            kinds = collections.Counter(type(chain) for chain in graph.chains.values())
            self.stats["convolutions"] += len(graph.convs)
            self.stats["requantized"] += kinds[_Chain]
            self.stats["adds"] += kinds[_AddChain]
            self.stats["moves"] += kinds[_Moved]
            return _IntegerConv(mod, graph).visit_expr(func)

        return relax.transform.DeadCodeElimination()(map_relax_functions(mod, rewrite))
