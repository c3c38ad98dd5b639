"""Attention over a dynamic key length, its keys padded to whole vectors (a pass of the layout phase).

With a dynamic key length S, the scores of ``softmax(Q K^T + mask) V`` run along rows of S, and a
vector along a row whose length is dynamic is split into whole vectors and a last one tested lane
by lane, which LLVM runs at scalar speed (an elementwise kernel over 100,003 floats: 50 us, 4 us
over 100,000). Here the keys (K^T's columns, V's rows, each score row) are padded with zeros to S
rounded up to a multiple of ``multiple``, every elementwise step between the scores and the product
with V runs on the padded rows (its operands indexed by key padded with zeros), and the padded
scores are set to -inf right before the softmax. Their probabilities are then exactly 0 (exp(-inf
- max) is 0 for any max; a fully masked row's 0 / 0 stays NaN, as unpadded), so the product with V,
whose padded rows are zeros, adds only zeros to the same terms: the result is the unpadded one
(to the rounding of a reduction order that the vector-wide schedule changes: 9.5e-7 apart on one of
six BERT sizes, equal on the others). A dynamic number of queries is padded to whole register tiles
(``ROWS``) the same way, and the product's padded rows sliced off. Static key lengths keep their forms (``passes/dense.py`` pads those
that no vector divides).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax, te, tirx
from tvm.sym.analyzer import Analyzer

from relaxc.passes.ir import constant_array, is_op, rewrite_emitting

INJECTIVE = 2  # FuseOps' kInjective: TVM's analysis reads opaque through the padding's clamped index
ROWS = 8  # dynamic query rows are padded to whole register tiles of this many (schedules/cpu/tile_plan.py's;
# schedules/default.py's representative sizes keep them whole)
ELEMENTWISE = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.where", "relax.maximum",
               "relax.minimum", "relax.negative", "relax.isnan", "relax.astype", "relax.exp"}


def pad_keys(x: te.Tensor, axis: int, length: tirx.PrimExpr, padded: tirx.PrimExpr) -> te.Tensor:
    """``x`` with its ``axis`` (of ``length``) padded with zeros to ``padded``; no load past ``length``."""
    axis = axis % len(x.shape)
    shape = [padded if i == axis else d for i, d in enumerate(x.shape)]

    def value(*index):
        inside = [te.min(i, length - 1) if a == axis else i for a, i in enumerate(index)]
        return te.if_then_else(index[axis] < length, x[tuple(inside)], tirx.const(0, x.dtype))

    return te.compute(shape, value, name="pad_keys")


def mask_padded_keys(x: te.Tensor, length: tirx.PrimExpr) -> te.Tensor:
    """Scores whose keys past ``length`` are -inf: a select, which vectorises."""
    return te.compute(x.shape, lambda *i: tirx.Select(i[-1] < length, x[i], tirx.const(float("-inf"), x.dtype)),
                      name="mask_padded_keys")


def _last(expr: relax.Expr, axis: int = -1) -> tirx.PrimExpr | None:
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr) or len(ty.shape.values) < -axis:
        return None
    return ty.shape.values[axis]


def _reshaped_axis(value: relax.Expr, keys: tirx.PrimExpr) -> int | None:
    """The axis of a reshape's input that its last output axis (of ``keys``) is, if the reshape
    keeps that dim whole (the dims before it multiply to the same), else None."""
    if not is_op(value, "relax.reshape") or not isinstance(value.args[1], relax.ShapeExpr):
        return None
    source, target = list(value.args[0].ty.shape.values), list(value.args[1].values)
    hits = [i for i, d in enumerate(source) if _same(d, keys)]
    if len(hits) != 1 or not _same(target[-1], keys):
        return None
    analyzer = Analyzer()
    before = lambda dims: analyzer.simplify(math.prod(dims, start=tirx.const(1, "int64")))  # noqa: E731
    return hits[0] if _same(before(source[:hits[0]]), before(target[:-1])) else None


def _scaled(value: relax.Expr) -> bool:
    """Whether ``value`` is an elementwise step of its first operand and a scalar constant."""
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) \
        and value.op.name in ("relax.multiply", "relax.divide", "relax.add", "relax.subtract") \
        and constant_array(value.args[1]) is not None and constant_array(value.args[1]).size == 1


def _same(a: tirx.PrimExpr | None, b: tirx.PrimExpr | None) -> bool:
    """Whether two dims are equal for every size (``past + sequence - past`` is ``sequence``)."""
    return a is not None and b is not None and Analyzer().can_prove_equal(a, b)


@relax.expr_functor.mutator
class _Padder(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, multiple: int, stats: dict) -> None:
        super().__init__(mod)
        self.multiple = multiple
        self.stats = stats
        self.bound: dict[relax.Var, relax.Expr] = {}  # every binding of the function, by its variable
        self.users: dict[relax.Var, set[relax.Var]] = {}  # the bindings that read each variable
        self.pads: dict[tuple, relax.Expr] = {}  # each padding made, by (value, axis): a mask all layers add is padded once

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        self.bound, self.users, self.pads = {}, {}, {}
        for block in func.body.blocks:
            for binding in block.bindings:
                self.bound[binding.var] = binding.value
                for var in relax.analysis.free_vars(binding.value):
                    self.users.setdefault(var, set()).add(binding.var)
        for var in relax.analysis.free_vars(func.body.body):
            self.users.setdefault(var, set()).add(None)  # returned
        return super().visit_function_(func)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        found = self._attention(binding.var, value) if is_op(value, "relax.matmul") else None
        if found is None:
            return super().visit_var_binding_(binding)
        self.stats["padded_attentions"] += 1
        new = self._padded(value, *found)
        self.set_var_remap(binding.var, self.builder_.emit(new, name_hint=binding.var.name))

    def _attention(self, var: relax.Var, product: relax.Call) -> tuple | None:
        """(softmax, the steps between the scores and the product, the scores matmul, the key
        length) of ``var = P V`` where P is the softmax of the scores through elementwise steps, the
        key length dynamic, and nothing else reads what lies between; else None."""
        probabilities, values = product.args
        keys = _last(probabilities)
        if keys is None or isinstance(keys, tirx.IntImm) or not _same(keys, _last(values, -2)):
            return None
        region: set[relax.Var] = set()
        softmax = self._walk(probabilities, region, lambda value: is_op(value, "relax.nn.softmax"))
        if softmax is None or int(self.bound[softmax].attrs.axis) not in (-1, len(softmax.ty.shape.values) - 1):
            return None
        scores = self._walk(self.bound[softmax].args[0], region,
                            lambda value: is_op(value, "relax.matmul") and _same(_last(value.args[1]), keys))
        inside = region | {softmax, scores}
        if scores is None or any(not self.users.get(v, set()) <= inside | {var} for v in inside):
            return None
        return self.bound[softmax], region, self.bound[scores], keys

    def _walk(self, expr: relax.Expr, region: set, found) -> relax.Var | None:
        """From ``expr`` back through elementwise steps to the one variable whose value ``found``
        accepts, each step on the way added to ``region``; None if none or several."""
        if not isinstance(expr, relax.Var) or expr not in self.bound:
            return None
        value = self.bound[expr]
        if found(value):
            return expr
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op) or value.op.name not in ELEMENTWISE:
            return None
        region.add(expr)
        reached = None
        for arg in value.args:
            if isinstance(arg, relax.Var) and self._leads_to(arg, found):
                hit = self._walk(arg, region, found)
                if hit is None or reached is not None and not hit.same_as(reached):
                    return None
                reached = hit
        return reached

    def _leads_to(self, var: relax.Var, found) -> bool:
        value = self.bound.get(var)
        if value is None:
            return False
        return found(value) or isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) \
            and value.op.name in ELEMENTWISE and any(isinstance(a, relax.Var) and self._leads_to(a, found)
                                                     for a in value.args)

    def _padded(self, product: relax.Call, softmax: relax.Call, region: set, scores: relax.Call,
                keys: tirx.PrimExpr) -> relax.Expr:
        padded = (keys + self.multiple - 1) // self.multiple * self.multiple
        queries = _last(scores.args[0], -2)
        rows = None if isinstance(queries, tirx.IntImm) else (queries + ROWS - 1) // ROWS * ROWS
        emit = self.builder_.emit

        def pad(expr: relax.Expr, axis: int, length: tirx.PrimExpr = keys, to: tirx.PrimExpr = padded) -> relax.Expr:
            key = (expr, axis)
            if key not in self.pads:
                self.pads[key] = emit(self.builder_.call_te(pad_keys, expr, axis, length, to, primfunc_name_hint="pad_keys",
                                                            primfunc_attrs={"op_pattern": INJECTIVE}))
            return self.pads[key]

        def pad_rows(expr: relax.Expr) -> relax.Expr:
            return pad(expr, -2, queries, rows) if rows is not None and _same(_last(expr, -2), queries) else expr

        def pad_at_source(expr: relax.Expr, axis: int) -> relax.Expr:
            """``expr`` (a variable of the function as it was) padded along its keys' ``axis``: where
            they are its innermost dim, back through the transposes, reshapes and scalings that made
            it, to where they are not. K^T has its keys innermost, and its padded copy ran a lane at a
            time there (GPT-2: 0.58 ms of 4.5 at sequence 128)."""
            value = self.bound.get(expr) if isinstance(expr, relax.Var) else None
            rank = len(expr.ty.shape.values)
            if value is None or axis % rank != rank - 1:
                return pad(self.visit_expr(expr), axis)
            if is_op(value, "relax.permute_dims") and value.attrs.axes is not None:
                axes = [int(a) for a in value.attrs.axes]
                return emit(relax.op.permute_dims(pad_at_source(value.args[0], axes[-1]), axes))
            source = _reshaped_axis(value, keys)
            if source is not None:
                target = [padded if i == rank - 1 else d for i, d in enumerate(value.args[1].values)]
                return emit(relax.op.reshape(pad_at_source(value.args[0], source), relax.ShapeExpr(target)))
            if _scaled(value):
                return emit(relax.Call(value.op, [pad_at_source(value.args[0], axis), value.args[1]], value.attrs))
            return pad(self.visit_expr(expr), axis)

        made: dict[relax.Var, relax.Expr] = {}

        def rebuilt(expr: relax.Expr) -> relax.Expr:
            if not isinstance(expr, relax.Var):
                return expr
            if expr not in made:
                value = self.bound.get(expr)
                if value is not None and value.same_as(scores):
                    made[expr] = emit(relax.op.matmul(pad_rows(self.visit_expr(scores.args[0])),
                                                      pad_at_source(scores.args[1], -1)))
                elif value is not None and value.same_as(softmax):
                    scored = rebuilt(softmax.args[0])
                    masked = emit(self.builder_.call_te(mask_padded_keys, scored, keys,
                                                        primfunc_name_hint="mask_padded_keys"))
                    made[expr] = emit(relax.op.nn.softmax(masked, axis=-1))
                elif expr in region:
                    made[expr] = emit(relax.Call(value.op, [rebuilt(a) for a in value.args], value.attrs,
                                                 value.ty_args))
                else:  # from outside the attention: a mask by key (or query) is padded, a broadcast stays
                    outside = pad_rows(self.visit_expr(expr))
                    made[expr] = pad(outside, -1) if _same(_last(expr), keys) else outside
            return made[expr]

        result = relax.op.matmul(rebuilt(product.args[0]), pad(self.visit_expr(product.args[1]), -2),
                                 out_dtype=product.attrs.out_dtype)
        if rows is None:
            return result
        rank = len(product.ty.shape.values)
        # within the padded rows: its shape is then (.., queries, ..), as the reshapes after it read
        return relax.op.strided_slice(emit(result), [rank - 2], [0], [queries], assume_inbound=True)


@tvm.transform.module_pass(opt_level=0, name="relaxc.PadAttentionKeys")
class PadAttentionKeys:
    """Pad a dynamic key length of ``softmax(scores) V`` attention to a multiple of ``multiple``
    (the vector lanes); ``summary()`` (``report()["attention"]``) counts the attentions padded."""

    report_key = "attention"

    def __init__(self, multiple: int) -> None:
        self.multiple = multiple
        self.stats = {"padded_attentions": 0}

    def summary(self) -> dict:
        return dict(self.stats)

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.stats = {"padded_attentions": 0}
        return rewrite_emitting(mod, _Padder(mod.clone(), self.multiple, self.stats))
