"""A decoder's key/value cache kept in place: each step writes its new rows into a cache allocated
once (a pass of the layout phase, for a decoder compiled with ``max_length``).

As exported, a decoder step takes each layer's past keys and values ``[batch, heads, past, dim]``
and returns them extended, ``Concat(past, new)``: every step copies the whole cache into a newly
allocated present (GPT-2 small with 1,024 tokens cached: 72 MB a step). Here ``main`` takes one
cache per past instead, ``[batch, heads, rows, dim]`` with ``rows`` the longest sequence rounded up
to whole vectors, and the number of tokens it holds (a shape argument, ``past``); the step writes
its new rows at ``past`` in place (``call_tir_inplace``) and returns the logits alone. What read the
concatenation reads the cache's first ``past + sequence`` rows, and an attention's keys padded to
whole vectors (``passes/attention.py``) read its first rows up to that padding: rows written by no
step of this conversation are zeros or an earlier one's keys, finite either way, and padded keys
are masked to -inf before the softmax, so their probabilities are exactly 0.
"""

from __future__ import annotations

import tvm
from tvm import relax, te, tirx
from tvm_ffi import structural_equal
from tvm.script import tirx as T

from relaxc.passes.attention import INJECTIVE
from relaxc.passes.ir import is_op, rewrite_emitting

SEQUENCE_AXIS = 2  # of a past, a present and a cache


def append_rows(heads: int, rows: int, dim: int, dtype: str) -> tirx.PrimFunc:
    """The kernel writing a step's ``[batch, heads, sequence, dim]`` into a cache at row ``past``."""

    @T.prim_func(private=True, check_well_formed=False)
    def append(var_cache: T.handle, var_new: T.handle, past: T.int64):
        T.func_attr({"op_pattern": 8, "tirx.noalias": True})  # opaque: FuseOps leaves it alone
        batch, sequence = T.int64(), T.int64()
        cache = T.match_buffer(var_cache, (batch, heads, rows, dim), dtype)
        new = T.match_buffer(var_new, (batch, heads, sequence, dim), dtype)
        for b, h, s, d in T.grid(batch, heads, sequence, dim):
            with T.sblock("append_rows"):
                vb, vh, vs, vd = T.axis.remap("SSSS", [b, h, s, d])
                cache[vb, vh, past + vs, vd] = new[vb, vh, vs, vd]

    return append


def first_rows(cache: te.Tensor, rows: tirx.PrimExpr) -> te.Tensor:
    """The first ``rows`` rows of ``cache`` (along the sequence axis)."""
    shape = [rows if axis == SEQUENCE_AXIS else d for axis, d in enumerate(cache.shape)]
    return te.compute(shape, lambda *i: cache[i], name="cache_rows")


def _concat(value: relax.Expr, parts: int) -> bool:
    """Whether ``value`` concatenates ``parts`` tensors along the sequence axis."""
    return is_op(value, "relax.concat") and isinstance(value.args[0], relax.Tuple) \
        and len(value.args[0].fields) == parts and int(value.attrs.axis) % 4 == SEQUENCE_AXIS


def _past_of(value: relax.Expr, bound: dict, pasts: set) -> relax.Var | None:
    """The past parameter ``value`` is, through reshapes to its own shape and one-part concats
    (an exporter's Identity); else None."""
    while isinstance(value, relax.Var) and value not in pasts and value in bound:
        step = bound[value]
        if _concat(step, 1):
            value = step.args[0].fields[0]
        elif is_op(step, "relax.reshape") and structural_equal(step.args[0].ty.shape, value.ty.shape):
            value = step.args[0]
        else:
            return None
    return value if isinstance(value, relax.Var) and value in pasts else None


@relax.expr_functor.mutator
class _InPlace(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, pasts: list[int], rows: int, stats: dict) -> None:
        super().__init__(mod)
        self.past_indices, self.rows, self.stats = pasts, rows, stats

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        if "global_symbol" not in (func.attrs or {}) or func.attrs["global_symbol"] != "main":
            return func
        params = list(func.params)
        pasts = [params[i] for i in self.past_indices]
        self.caches: dict[relax.Var, relax.Var] = {}
        for past in pasts:
            batch, heads, _, dim = past.ty.shape.values
            shape = relax.ShapeExpr([batch, heads, tirx.IntImm("int64", self.rows), dim])
            self.caches[past] = relax.Var(past.name.replace("past", "cache", 1) if "past" in past.name
                                          else f"cache_{past.name}", relax.TensorType(shape, past.ty.dtype))
        self.length = pasts[0].ty.shape.values[SEQUENCE_AXIS]
        if any(not structural_equal(p.ty.shape.values[SEQUENCE_AXIS], self.length) for p in pasts):
            return func  # pasts of different lengths: not one cache
        self.bound = {b.var: b.value for block in func.body.blocks for b in block.bindings}
        self.written: dict[relax.Var, tuple[relax.Var, relax.Expr]] = {}  # concat -> (written cache, its length)
        self.appended = 0
        body = self.visit_expr(func.body)
        if self.appended != len(pasts):
            raise ValueError(f"{self.appended} of {len(pasts)} pasts are concatenated in place")
        self.stats["caches"] = self.appended
        bound = {b.var: b.value for block in body.blocks for b in block.bindings}
        outputs = bound.get(body.body, body.body)
        logits = outputs.fields[0]  # the model's first output (decoder.recognise checked it)
        body = relax.SeqExpr(body.blocks, relax.Tuple([logits]))
        length = relax.Var("past_length", relax.ShapeType([self.length]))
        new_params = [self.caches.get(p, p) for p in params] + [length]
        attrs = dict(func.attrs)
        attrs["num_input"] = len(new_params)
        return relax.Function(new_params, body, relax.TupleType([logits.ty]), func.is_pure, tvm.ir.make_node("ir.DictAttrs", **attrs))

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        if _concat(value, 2):
            past = _past_of(value.args[0].fields[0], self.bound, set(self.caches))
            if past is not None:
                return self._append(binding.var, past, self.visit_expr(value.args[0].fields[1]))
        if isinstance(value, relax.Call) and value.op.same_as(tvm.ir.Op.get("relax.call_tir")) \
                and value.args[0].name_hint.startswith("pad_keys"):
            source = value.args[1].fields[0]
            padded = value.ty.shape.values[SEQUENCE_AXIS]
            if source in self.written and not structural_equal(padded, source.ty.shape.values[SEQUENCE_AXIS]):
                cache, _ = self.written[source]
                return self.set_var_remap(binding.var, self._rows(cache, padded, binding.var.name))
        return super().visit_var_binding_(binding)

    def _rows(self, cache: relax.Expr, rows: tirx.PrimExpr, name: str) -> relax.Var:
        """The first ``rows`` of ``cache``: a copy that fuses into its readers, as the padding did."""
        return self.builder_.emit(self.builder_.call_te(first_rows, cache, rows, primfunc_name_hint="cache_rows",
                                                        primfunc_attrs={"op_pattern": INJECTIVE}), name_hint=name)

    def _append(self, var: relax.Var, past: relax.Var, new: relax.Expr) -> None:
        cache = self.caches[past]
        kernel = append_rows(int(cache.ty.shape.values[1]), self.rows, int(cache.ty.shape.values[3]), cache.ty.dtype)
        gvar = self.builder_.add_func(kernel, "append_rows")
        written = self.builder_.emit(relax.call_tir_inplace(gvar, [cache, new, relax.prim_value(self.length)], [0],
                                                            cache.ty),
                                     name_hint=f"{cache.name}_written")
        total = var.ty.shape.values[SEQUENCE_AXIS]
        self.written[var] = (written, total)
        self.set_var_remap(var, self._rows(written, total, var.name))
        self.appended += 1


@tvm.transform.module_pass(opt_level=0, name="relaxc.CacheInPlace")
class CacheInPlace:
    """``main``'s pasts (parameters ``past_indices``) become caches of ``rows`` rows written in
    place, its presents dropped; ``summary()`` (``report()["kv_cache"]``) counts the caches."""

    report_key = "kv_cache"

    def __init__(self, past_indices: list[int], rows: int) -> None:
        self.past_indices, self.rows = past_indices, rows
        self.stats = {"caches": 0, "rows": rows}

    def summary(self) -> dict:
        return dict(self.stats)

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_emitting(mod, _InPlace(mod.clone(), self.past_indices, self.rows, self.stats))
