"""Channels-last stretches back in NCHW, so that the layout pass can keep them blocked.

PyTorch models that normalise over channels (ConvNeXt's blocks and downsampling layers) are exported
as ``permute_dims(x, [0, 2, 3, 1])``, then LayerNorm over the last axis, Linear layers (``matmul``
by a constant weight) with GELU between them and a bias and layer scale, then
``permute_dims(.., [0, 3, 1, 2])`` back. The same computation in NCHW is a LayerNorm over C and 1x1
convolutions: the layout pass keeps those blocked, while the exported form paid, per block, a
converter from the blocked layout and a transpose on the way in and both again on the way out
(ConvNeXt-T: 44 converters).

A stretch is the set of values connected to such a permute through ops that have an NCHW
equivalent (LayerNorm over the last axis, ``matmul`` by a constant 2-D weight, elementwise ops
whose other operands are scalars, per-channel constants or values of the stretch), ending in the
inverse permutes. It is rewritten only whole: if any of its values is read by anything else or
leaves the function, or it never permutes back, it stays as exported.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import tvm
from tvm import relax

from relaxc.passes.ir import constant_array, is_op, map_relax_functions, static_shape

TO_LAST, TO_FIRST = [0, 2, 3, 1], [0, 3, 1, 2]
UNARY = {"relax.erf", "relax.tanh", "relax.sigmoid", "relax.exp", "relax.sqrt", "relax.negative",
         "relax.nn.relu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu", "relax.clip"}
BINARY = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum"}


def _permutation(expr: relax.Expr) -> list[int] | None:
    if not is_op(expr, "relax.permute_dims") or expr.attrs.axes is None:
        return None
    return [int(a) for a in expr.attrs.axes]


def _channel_constant(array: np.ndarray, channels: int) -> np.ndarray | None:
    """A constant that broadcasts along NHWC's last axis, as it broadcasts in NCHW: scalars stay,
    per-channel vectors become (1, C, 1, 1)."""
    if array.ndim == 0 or array.size == 1 and array.ndim <= 4:
        return array
    if array.size == channels and array.shape[-1] == channels:
        return array.reshape(1, channels, 1, 1)
    return None


class _Stretches:
    """Which bindings of a function belong to a channels-last stretch that can be rewritten whole."""

    def __init__(self, func: relax.Function) -> None:
        self.parent: dict[relax.Var, relax.Var] = {}
        self.starts: set[relax.Var] = set()
        self.ends: set[relax.Var] = set()
        bad: set[relax.Var] = set()
        for block in func.body.blocks:
            for binding in block.bindings:
                self._visit(binding, bad, isinstance(block, relax.DataflowBlock))
        returned = relax.analysis.free_vars(func.body.body)
        bad |= {self._root(v) for v in returned if self._inside(v)}
        closed = {self._root(v) for v in self.ends}
        self.members = {v for v in self.parent if self._root(v) in closed and self._root(v) not in bad}

    def _root(self, var: relax.Var) -> relax.Var:
        while self.parent[var] is not var:
            var = self.parent[var]
        return var

    def _join(self, var: relax.Var, others: list[relax.Var]) -> None:
        self.parent[var] = var
        for other in others:
            self.parent[self._root(other)] = self._root(var)

    def _inside(self, var: relax.Var) -> bool:
        """Whether ``var`` is an NHWC value of a stretch (its ends are NCHW: anything may read them)."""
        return var in self.parent and var not in self.ends

    def _visit(self, binding: relax.Binding, bad: set, in_dataflow: bool) -> None:
        var, value = binding.var, getattr(binding, "value", None)
        inside = [v for v in relax.analysis.free_vars(value) if self._inside(v)] if value is not None else []
        if not in_dataflow or value is None:
            bad.update(self._root(v) for v in inside)
            return
        if _permutation(value) == TO_LAST and not inside and len(static_shape(value) or ()) == 4:
            self._join(var, [])
            self.starts.add(var)
            return
        if not inside:
            return
        if _translatable(value, self._inside):
            self._join(var, inside)
            if _permutation(value) == TO_FIRST:
                self.ends.add(var)
            return
        bad.update(self._root(v) for v in inside)


def _translatable(call: relax.Expr, inside: Callable[[relax.Var], bool]) -> bool:
    """Whether ``call``, whose operands ``inside`` a stretch are NHWC, has an NCHW form (see ``_translate``)."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return False
    shape = static_shape(call)
    if shape is None or len(shape) != 4:
        return False
    name, args = call.op.name, call.args
    if name == "relax.permute_dims":
        return _permutation(call) == TO_FIRST
    if name == "relax.nn.layer_norm":
        return [int(a) % 4 for a in call.attrs.axes] == [3] and inside(args[0])
    if name == "relax.matmul":
        weight = constant_array(args[1])
        return inside(args[0]) and weight is not None and weight.ndim == 2
    if name in UNARY:
        return inside(args[0])
    if name in BINARY:
        for arg in args:
            array = constant_array(arg)
            if not inside(arg) and (array is None or _channel_constant(array, shape[3]) is None):
                return False
        return True
    return False


def _translate(call: relax.Call, nchw: Callable[[relax.Expr], relax.Expr]) -> relax.Expr:
    """The NCHW form of a stretch's op; ``nchw`` gives an operand's NCHW version."""
    name, args = call.op.name, call.args
    if name == "relax.permute_dims":
        return nchw(args[0])
    if name == "relax.nn.layer_norm":
        attrs = call.attrs
        return relax.op.nn.layer_norm(nchw(args[0]), args[1], args[2], axes=[1], epsilon=attrs.epsilon,
                                      center=attrs.center, scale=attrs.scale)
    if name == "relax.matmul":
        weight = constant_array(args[1])
        return relax.op.nn.conv2d(nchw(args[0]), relax.const(np.ascontiguousarray(weight.T[:, :, None, None])))
    channels = static_shape(call)[3]
    operands = []
    for arg in args:
        array = constant_array(arg)
        operands.append(relax.const(_channel_constant(array, channels), str(array.dtype))
                        if array is not None else nchw(arg))
    return relax.Call(call.op, operands, call.attrs, call.ty_args)


@relax.expr_functor.mutator
class _ToNCHW(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, stretches: _Stretches) -> None:
        super().__init__(mod)
        self.stretches = stretches
        self.nchw: dict[relax.Var, relax.Expr] = {}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        var = binding.var
        if var not in self.stretches.members:
            super().visit_var_binding_(binding)
            return
        if var in self.stretches.starts:
            self.nchw[var] = self.visit_expr(binding.value.args[0])  # the stretch's NCHW input
            return
        new = _translate(binding.value, lambda arg: self.nchw[arg] if arg in self.nchw else self.visit_expr(arg))
        if isinstance(var, relax.DataflowVar):
            emitted = new if var in self.stretches.ends else self.builder_.emit(new, name_hint=var.name)
        else:
            emitted = self.builder_.emit_output(new, name_hint=var.name)
        self.nchw[var] = emitted
        self.set_var_remap(var, emitted)


@tvm.transform.module_pass(opt_level=0, name="relaxc.ChannelsLastToNCHW")
class ChannelsLastToNCHW:
    """Channels-last stretches (permute to NHWC ... permute back) rewritten in NCHW."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        def rewrite(func: relax.Function) -> relax.Function:
            stretches = _Stretches(func)
            return _ToNCHW(mod, stretches).visit_expr(func) if stretches.members else func
        return map_relax_functions(mod, rewrite)
