"""Quantized operators (QDQ form) to integer arithmetic, rounding as onnxruntime does.

ONNX's QDQ form writes an int8 convolution as ``Conv(DequantizeLinear(xq), DequantizeLinear(wq))``
(bias ``DequantizeLinear(bq)``, maybe a ReLU) followed by a ``QuantizeLinear``; TVM imports it as
float arithmetic on dequantized tensors. This pass finds, in each function, every chain up to a
uint8 ``quantize`` that onnxruntime computes as one integer kernel, and every product of
dequantized uint8 data and int8 weights, then rewrites each on the integers, so that the int8
result is onnxruntime's to the bit wherever the sums are:

- ``products.py``: convolutions and matmuls summed on the integers, requantized as
  ``QLinearConv`` and ``QLinearMatMul`` do; ``saturated_pairs.py``: those sums paired as
  onnxruntime pairs them where the byte dot product saturates pairs of products (no VNNI);
- ``addition.py``: additions of two uint8 tensors as ``QLinearAdd``;
- ``tables.py``: pointwise arithmetic on one uint8 tensor as a 256-entry table;
- ``pooling.py``: max pooling and reshapes at one scale on the uint8 tensor, average pooling
  rounded as onnxruntime's int8 pooling;
- ``common.py``: what they share (bindings, scalars, the final uint8 rounding).

A matmul of two computed tensors (attention) stays in float. Forms left in float arithmetic are
counted in ``summary()`` (``report()["quantized"]``) with why.
"""

from __future__ import annotations

import collections

import numpy as np
import tvm
from tvm import relax

from relaxc.passes.ir import is_op
from relaxc.passes.quantized import addition, pooling, products, tables
from relaxc.passes.quantized.common import Bindings, scalar
from relaxc.passes.signed_activations import SIGNED_ATTR

_ACTIVATIONS = ("relax.nn.relu", "relax.clip")
_Chain = products.ProductChain | addition.AddChain | pooling.Moved | pooling.Averaged | tables.Table


def _covers(clip: relax.Call, scale: float, zero: float) -> bool:
    """Whether a ``clip`` before a uint8 ``quantize`` only cuts below at 0 (a ReLU6 whose top the
    quantization's range already cuts, as onnxruntime's quantizer sets it)."""
    low, high = (float(v.value) for v in clip.args[1:])
    return low == 0.0 and high >= (255 - zero) * scale


class _Graph:
    """The quantized convolutions of one function and the chains they end, found before any rewrite."""

    def __init__(self, func: relax.Function, refused: collections.Counter, saturated_pairs: bool) -> None:
        self.bindings = Bindings(func)
        self.convs: dict[relax.Var, products.Operands] = {}
        for var, value in self.bindings.values.items():
            if is_op(value, "relax.nn.conv2d") or is_op(value, "relax.matmul"):
                operands = products.read_operands(self.bindings, value, refused, saturated_pairs)
                if operands is not None:
                    self.convs[var] = operands
        # each uint8 quantize's values as a function of one uint8 tensor, where it is one, found in
        # binding order so a later one reads an earlier one's here instead of evaluating it again
        self.forms: dict[relax.Var, tuple[relax.Expr, np.ndarray]] = {}
        self.chains: dict[relax.Var, _Chain] = {}
        for var, value in self.bindings.values.items():
            if not is_op(value, "relax.quantize"):
                continue
            form = tables.read_form(self.bindings, self.forms, value)
            if form is not None:
                self.forms[var] = form
            chain = self._fused(value) or tables.read_table(self.bindings, value, form)
            if chain is not None:
                self.chains[var] = chain
        owned = {id(chain.operands.conv) for chain in self.chains.values()
                 if isinstance(chain, products.ProductChain)}
        self.alone = {var: ops for var, ops in self.convs.items() if id(ops.conv) not in owned}

    def _fused(self, call: relax.Call) -> _Chain | None:
        """A ``quantize`` ending one of the forms onnxruntime fuses into one integer kernel."""
        value, y_scale, y_zero = call.args
        scale, zero = scalar(y_scale), scalar(y_zero)
        if str(call.attrs.out_dtype) != "uint8" or scale is None or zero is None:
            return None
        relu, bias = False, None
        node = self.bindings.single(value)
        pooled = None if node is None else pooling.read_pooling(self.bindings, node[1], scale, zero)
        if pooled is not None:
            return pooled
        if node is not None and any(is_op(node[1], op) for op in _ACTIVATIONS):
            if is_op(node[1], "relax.clip") and not _covers(node[1], scale, zero):
                return None
            relu, node = True, self.bindings.single(node[1].args[0])
        if node is not None and is_op(node[1], "relax.add") and (not relu or zero == 0):
            added = addition.read_add(self.bindings, node[1], scale, zero)
            if added is not None:
                return added
        if node is not None and is_op(node[1], "relax.add"):
            conv, added = (self.bindings.single(a) for a in node[1].args)
            if conv is None or added is None or conv[0] not in self.convs:
                return None
            bias = products.read_bias(self.bindings, added[1], self.convs[conv[0]])
            if bias is None:
                return None
            node = conv
        if node is None or node[0] not in self.convs:
            return None
        return products.ProductChain(self.convs[node[0]], bias, relu, scale, int(zero))


@relax.expr_functor.mutator
class _IntegerRewriter(relax.PyExprMutator):
    """A function with each chain of its ``_Graph``, and each product no chain owns, on the integers."""

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
            new = products.unrequantized(self, self.graph.alone[var])
        else:
            super().visit_var_binding_(binding)
            return
        is_output = self.builder_.current_block_is_dataflow() and not isinstance(var, relax.DataflowVar)
        emit = self.builder_.emit_output if is_output else self.builder_.emit
        self.set_var_remap(var, emit(new, name_hint=var.name))

    def _built(self, chain: _Chain) -> relax.Expr:
        if isinstance(chain, products.ProductChain):
            return products.requantized(self, chain)
        if isinstance(chain, pooling.Averaged):
            return pooling.averaged(self, chain)
        if isinstance(chain, addition.AddChain):
            return addition.added(self, chain)
        if isinstance(chain, tables.Table):
            return tables.looked_up(self, chain)
        return pooling.moved(self, chain)


def _stats() -> dict:
    return {"convolutions": 0, "matmuls": 0, "requantized": 0, "adds": 0, "moves": 0, "averages": 0, "tables": 0,
            "float": collections.Counter()}


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
                rewriter = _IntegerRewriter(mod.clone(), self._graph(func), self.saturated_pairs,
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
        self.stats["requantized"] += kinds[products.ProductChain]
        self.stats["adds"] += kinds[addition.AddChain]
        self.stats["moves"] += kinds[pooling.Moved]
        self.stats["averages"] += kinds[pooling.Averaged]
        self.stats["tables"] += kinds[tables.Table]
        return graph
