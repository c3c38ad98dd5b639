"""A decoder's key/value cache kept in place: each step writes its new rows into a cache allocated
once, and attention reads it there (a pass of the layout phase, for a decoder compiled with
``max_length``).

As exported, a decoder step takes each layer's past keys and values ``[batch, heads, past, dim]``
and returns them extended, ``Concat(past, new)``: every step copies the whole cache into a newly
allocated present (GPT-2 small with 1,024 tokens cached: 72 MB a step), and attention's padding
(``passes/attention.py``), transposes and grouped-query repeats copied it again. Here ``main`` and
``decode`` take one cache per past instead, ``[batch, heads, rows, dim]`` with ``rows`` the longest
sequence rounded up to whole vectors, and the number of tokens it holds (a shape argument,
``past``); the step writes its new rows at ``past`` in place (``call_tir_inplace``) and returns the
logits alone. ``decode`` takes each row's own length as well (``write_at``, int64 ``[batch]``, each at
most ``past``) and writes row ``b``'s new keys and values there: with an attention mask that reads
each row's columns up to its own, rows cached to different lengths share one step (a server's
continuous batching, docs/design.md). Where one attention product alone reads a past's
concatenation (through the grouped-query repeat, the padding, for keys a transpose and constant
scalings), that product reads the cache itself up to the padded length; the keys' cache is then ``[batch, heads, dim, rows]``,
written transposed and scaled (the same products of the same values). Other readers read the
cache's first ``past + sequence`` rows. Rows written by no step of this conversation are zeros or an
earlier one's, finite either way, and padded keys are masked to -inf before the softmax, so their
probabilities are exactly 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax, te, tirx
from tvm_ffi import structural_equal
from tvm.script import tirx as T

from relaxc.passes.attention import INJECTIVE
from relaxc.passes.ir import constant_array, is_op, rewrite_emitting
from relaxc.support.cache_layout import CacheLayout

SEQUENCE_AXIS = 2  # of a past, a present and a cache
CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def append_rows(heads: int, rows: int, dim: int, dtype: str, transposed: bool = False,
                each_row: bool = False) -> tirx.PrimFunc:
    """The kernel writing a step's ``[batch, heads, sequence, dim]`` into a cache at row ``past``
    (``transposed``: a cache of keys ``[batch, heads, dim, rows]``, at column ``past``); ``each_row``:
    row ``b`` at ``at[b]`` instead, a further int64 ``[batch]`` argument with ``0 <= at[b] <= past`` (rows
    cached to lengths of their own, ``decode``'s). A step that would write outside the cache raises
    ``InputError`` instead, whoever calls the program."""
    shape = (heads, dim, rows) if transposed else (heads, rows, dim)
    overflow = ("InputError", [f"past + sequence is outside the cache's {rows} rows (max_length rounded up to "
                               f"whole vectors): past must be 0 or more, past + sequence at most {rows}"])
    misplaced = ("InputError", ["a row's cache length (write_at) is outside 0..past: each row's new keys go "
                                "where its attention mask reads them"])

    @T.prim_func(private=True, check_well_formed=False)  # the parser's check verifies lowered TIR: no blocks
    def append(var_cache: T.handle, var_new: T.handle, past: T.int64):
        T.func_attr({"op_pattern": 8, "tirx.noalias": True})  # opaque: FuseOps leaves it alone
        batch, sequence = T.int64(), T.int64()
        cache = T.match_buffer(var_cache, (batch, *shape), dtype)
        new = T.match_buffer(var_new, (batch, heads, sequence, dim), dtype)
        with T.sblock("root"):
            assert 0 <= past and past + sequence <= rows, overflow
            for b, h, s, d in T.grid(batch, heads, sequence, dim):
                with T.sblock("append_rows"):
                    vb, vh, vs, vd = T.axis.remap("SSSS", [b, h, s, d])
                    if transposed:
                        T.reads(new[vb, vh, vs, vd])
                        T.writes(cache[vb, vh, vd, past + vs])
                        cache[vb, vh, vd, past + vs] = new[vb, vh, vs, vd]
                    else:
                        T.reads(new[vb, vh, vs, vd])
                        T.writes(cache[vb, vh, past + vs, vd])
                        cache[vb, vh, past + vs, vd] = new[vb, vh, vs, vd]

    @T.prim_func(private=True, check_well_formed=False)
    def append_at(var_cache: T.handle, var_new: T.handle, var_at: T.handle, past: T.int64):
        T.func_attr({"op_pattern": 8, "tirx.noalias": True})
        batch, sequence = T.int64(), T.int64()
        cache = T.match_buffer(var_cache, (batch, *shape), dtype)
        new = T.match_buffer(var_new, (batch, heads, sequence, dim), dtype)
        at = T.match_buffer(var_at, (batch,), "int64")
        with T.sblock("root"):
            assert 0 <= past and past + sequence <= rows, overflow
            for b in range(batch):
                assert 0 <= at[b] and at[b] <= past, misplaced
            for b, h, s, d in T.grid(batch, heads, sequence, dim):
                with T.sblock("append_rows"):
                    vb, vh, vs, vd = T.axis.remap("SSSS", [b, h, s, d])
                    if transposed:
                        T.reads(new[vb, vh, vs, vd], at[vb])
                        T.writes(cache[vb, vh, vd, at[vb] + vs])
                        cache[vb, vh, vd, at[vb] + vs] = new[vb, vh, vs, vd]
                    else:
                        T.reads(new[vb, vh, vs, vd], at[vb])
                        T.writes(cache[vb, vh, at[vb] + vs, vd])
                        cache[vb, vh, at[vb] + vs, vd] = new[vb, vh, vs, vd]

    return append_at if each_row else append


def scores_from_cache(queries: te.Tensor, keys: te.Tensor, padded: tirx.PrimExpr, groups: int) -> te.Tensor:
    """``queries [batch, heads, m, dim]`` times the first ``padded`` columns of a transposed cache
    of keys ``[batch, heads / groups, dim, rows]``: the attention scores, read from the cache in place."""
    d = te.reduce_axis((0, queries.shape[-1]), name="d")
    return te.compute((*queries.shape[:-1], padded),
                      lambda b, h, i, k: te.sum(queries[b, h, i, d] * keys[b, _head(h, groups), d, k], axis=d),
                      name="matmul")


def values_from_cache(probabilities: te.Tensor, values: te.Tensor, padded: tirx.PrimExpr, groups: int) -> te.Tensor:
    """``probabilities [batch, heads, m, padded]`` times the first ``padded`` rows of a cache of
    values ``[batch, heads / groups, rows, dim]``, read in place."""
    k = te.reduce_axis((0, padded), name="k")
    return te.compute((*probabilities.shape[:-1], values.shape[-1]),
                      lambda b, h, i, d: te.sum(probabilities[b, h, i, k] * values[b, _head(h, groups), k, d], axis=k),
                      name="matmul")


def _head(head: tirx.PrimExpr, groups: int) -> tirx.PrimExpr:
    """The cached head a query head reads: grouped-query attention shares one among ``groups``."""
    return head // groups if groups > 1 else head


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


@dataclass
class _Reader:
    """How an attention product reads a cache: the product (``keys``: the scores ``Q K^T``, with
    the scalar steps between K^T and it; else the values' ``P V``), at the padded key length, and the
    bindings between the concatenation and it, which reading the cache in place replaces."""

    product: relax.Var
    keys: bool
    padded: tirx.PrimExpr
    scalings: list[relax.Call]
    replaced: set[relax.Var]
    groups: int = 1  # query heads per cached head (grouped-query attention)


def _reader(concat: relax.Var, bound: dict, users: dict, output: relax.Var) -> _Reader | None:
    """How the one attention product that reads ``concat`` (repeated for groups of query heads, then
    padded to whole vectors; keys transposed, then scaled by constants) does, if nothing else reads
    it but the outputs."""
    at = _only_user(concat, users, output)
    repeated, groups = _repeated(at, bound, users)
    if repeated:
        at = _only_user(repeated[-1], users)
    value = bound.get(at)
    if not _pads_keys(value):
        return None
    chain, scalings, transposed = [*repeated, at], [], False
    while (user := _only_user(at, users)) is not None:
        step = bound[user]
        if is_op(step, "relax.matmul") and step.args[1].same_as(at) and len(step.ty.shape.values) == 4:
            return _Reader(user, transposed, value.ty.shape.values[SEQUENCE_AXIS], scalings, set(chain), groups) \
                if transposed or not scalings else None
        if not transposed and is_op(step, "relax.permute_dims") and step.attrs.axes is not None \
                and [int(a) for a in step.attrs.axes] == [0, 1, 3, 2]:
            transposed = True
        elif transposed and _scalar_step(step) and step.args[0].same_as(at):
            scalings.append(step)
        else:
            return None
        chain.append(user)
        at = user
    return None


def _pads_keys(value: relax.Expr | None) -> bool:
    """Whether ``value`` calls ``passes/attention.py``'s padding of keys to whole vectors."""
    return isinstance(value, relax.Call) and value.op.same_as(CALL_TIR) and value.args[0].name_hint.startswith("pad_keys")


def _only_user(var: relax.Var | None, users: dict, output: relax.Var | None = None) -> relax.Var | None:
    """The one binding that reads ``var`` (the function's output aside), else None."""
    readers = users.get(var, set()) - {output}
    return next(iter(readers)) if len(readers) == 1 else None


def _repeated(var: relax.Var | None, bound: dict, users: dict) -> tuple[list[relax.Var], int]:
    """Grouped-query attention's keys or values repeated for each group of query heads, as
    transformers exports it: ``var`` an ``expand_dims`` at axis 2, then ``broadcast_to`` the groups,
    then a ``reshape`` to heads x groups. Those three bindings and the groups; else none and 1."""
    expand = var if is_op(bound.get(var), "relax.expand_dims") else None
    broadcast = _only_user(expand, users)
    reshape = _only_user(broadcast, users)
    if expand is None or not is_op(bound.get(broadcast), "relax.broadcast_to") \
            or not is_op(bound.get(reshape), "relax.reshape") or [int(a) for a in bound[expand].attrs.axis] != [2]:
        return [], 1
    groups = broadcast.ty.shape.values[2] if len(broadcast.ty.shape.values) == 5 else None
    return ([expand, broadcast, reshape], int(groups)) if isinstance(groups, tirx.IntImm) else ([], 1)


def _scalar_step(value: relax.Expr) -> bool:
    """Whether ``value`` multiplies or divides its first operand by a scalar constant."""
    return isinstance(value, relax.Call) and any(is_op(value, f"relax.{op}") for op in ("multiply", "divide")) \
        and constant_array(value.args[1]) is not None and constant_array(value.args[1]).size == 1


@relax.expr_functor.mutator
class _InPlace(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, pasts: list[int], rows: int, stats: dict) -> None:
        super().__init__(mod)
        self.past_indices, self.rows, self.stats = pasts, rows, stats
        self.transposed: set[int] | None = None  # the pasts' indices whose caches hold keys transposed

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        if (func.attrs or {}).get("global_symbol") not in ("main", "decode"):  # passes/decode.py's
            return func
        params = list(func.params)
        pasts = [params[i] for i in self.past_indices]
        self.length = pasts[0].ty.shape.values[SEQUENCE_AXIS]
        batch = pasts[0].ty.shape.values[0]  # decode: each row's cache length, rows of their own
        self.write_at = (relax.Var("write_at", relax.TensorType(relax.ShapeExpr([batch]), "int64"))
                         if func.attrs["global_symbol"] == "decode" else None)
        if any(not structural_equal(p.ty.shape.values[SEQUENCE_AXIS], self.length) for p in pasts):
            raise ValueError("the pasts differ in length: decoder.recognise checks they share one dim")
        self.bound = {b.var: b.value for block in func.body.blocks for b in block.bindings}
        users: dict[relax.Var, set[relax.Var]] = {}
        for var, value in self.bound.items():
            for used in relax.analysis.free_vars(value):
                users.setdefault(used, set()).add(var)
        self.output = func.body.body
        extended = {var: _past_of(value.args[0].fields[0], self.bound, set(pasts))
                    for var, value in self.bound.items() if _concat(value, 2)}
        self.concats = {var: past for var, past in extended.items() if past is not None}  # each past's, extended
        self.readers = {past: reader for var, past in self.concats.items()  # those read in place, by past
                        if (reader := _reader(var, self.bound, users, self.output)) is not None}
        self.caches = {past: self._cache(past) for past in pasts}
        transposed = {i for i in self.past_indices if params[i] in self.readers and self.readers[params[i]].keys}
        if self.transposed is not None and transposed != self.transposed:  # one session's cache serves both
            raise ValueError(f"main and decode read different caches transposed: {self.transposed}, {transposed}")
        self.transposed = transposed
        self.written: dict[relax.Var, relax.Var] = {}  # concatenation -> the cache written
        self.products: dict[relax.Var, tuple[relax.Var, _Reader]] = {}  # product -> (cache, reader)
        self.replaced = set().union(*(r.replaced for r in self.readers.values()))
        body = self.visit_expr(func.body)
        if len(self.written) != len(pasts):
            raise ValueError(f"{len(self.written)} of {len(pasts)} pasts are concatenated in place")
        self.stats.update(caches=len(pasts), read_in_place=len(self.readers))
        logits = self.visit_expr(self.bound[self.output].fields[0])  # the model's first (decoder.recognise)
        length = relax.Var("past_length", relax.ShapeType([self.length]))
        new_params = [self.caches.get(p, p) for p in params] + [length]
        new_params += [self.write_at] if self.write_at is not None else []
        attrs = dict(func.attrs) | {"num_input": len(new_params)}
        return relax.Function(new_params, relax.SeqExpr(body.blocks, relax.Tuple([logits])),
                              relax.TupleType([logits.ty]), func.is_pure, tvm.ir.make_node("ir.DictAttrs", **attrs))

    def _cache(self, past: relax.Var) -> relax.Var:
        """The cache parameter for ``past``: keys its attention reads in place transposed."""
        batch, heads, _, dim = past.ty.shape.values
        rows = tirx.IntImm("int64", self.rows)
        reader = self.readers.get(past)
        shape = [batch, heads, dim, rows] if reader is not None and reader.keys else [batch, heads, rows, dim]
        name = past.name.replace("past", "cache", 1) if "past" in past.name else f"cache_{past.name}"
        return relax.Var(name, relax.TensorType(relax.ShapeExpr(shape), past.ty.dtype))

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        var, value = binding.var, binding.value
        if var.same_as(self.output) or var in self.replaced:
            return None  # the presents are no outputs; what a product read in place replaced
        if var in self.products:
            cache, reader = self.products[var]
            operand = self.visit_expr(value.args[0])
            product = scores_from_cache if reader.keys else values_from_cache
            call = self.builder_.call_te(product, operand, cache, reader.padded, reader.groups, primfunc_name_hint="matmul")
            return self.set_var_remap(var, self.builder_.emit(call, name_hint=var.name))
        if var in self.concats:
            return self._append(var, self.concats[var], self.visit_expr(value.args[0].fields[1]))
        if _pads_keys(value):
            source = value.args[1].fields[0]
            padded = value.ty.shape.values[SEQUENCE_AXIS]
            if source in self.written and not structural_equal(padded, source.ty.shape.values[SEQUENCE_AXIS]):
                return self.set_var_remap(var, self._rows(self.written[source], padded, var.name))
        return super().visit_var_binding_(binding)

    def _rows(self, cache: relax.Expr, rows: tirx.PrimExpr, name: str) -> relax.Var:
        """The first ``rows`` of ``cache``: a copy that fuses into its readers, as the padding did."""
        return self.builder_.emit(self.builder_.call_te(first_rows, cache, rows, primfunc_name_hint="cache_rows",
                                                        primfunc_attrs={"op_pattern": INJECTIVE}), name_hint=name)

    def _append(self, var: relax.Var, past: relax.Var, new: relax.Expr) -> None:
        cache, reader = self.caches[past], self.readers.get(past)
        keys = reader is not None and reader.keys
        for step in reader.scalings if keys else []:  # stored scaled: the same products of the same values
            new = self.builder_.emit(relax.Call(step.op, [new, step.args[1]], step.attrs, step.ty_args))
        heads, dim = int(past.ty.shape.values[1]), int(past.ty.shape.values[3])
        each_row = self.write_at is not None
        gvar = self.builder_.add_func(append_rows(heads, self.rows, dim, cache.ty.dtype, keys, each_row),
                                      "append_rows_at" if each_row else "append_rows")
        arguments = [cache, new, *([self.write_at] if each_row else []), relax.prim_value(self.length)]
        written = self.builder_.emit(relax.call_tir_inplace(gvar, arguments, [0], cache.ty),
                                     name_hint=f"{cache.name}_written")
        self.written[var] = written
        if reader is not None:
            self.products[reader.product] = (written, reader)
        else:
            self.set_var_remap(var, self._rows(written, var.ty.shape.values[SEQUENCE_AXIS], var.name))


@tvm.transform.module_pass(opt_level=0, name="relaxc.CacheInPlace")
class CacheInPlace:
    """The pasts of ``main`` and ``decode`` (``pasts``: their names by parameter index) become caches of
    ``rows`` rows written and read in place, the presents dropped. ``decoder`` (``report()["decoder"]``)
    gets the caches' layout (``cache``: ``support.cache_layout.CacheLayout``, which pasts are kept
    transposed among them), which a session allocates by; ``summary()`` (``report()["kv_cache"]``)
    counts the caches and those attention reads in place."""

    report_key = "kv_cache"

    def __init__(self, pasts: dict[int, str], rows: int, decoder: dict) -> None:
        self.pasts, self.rows, self.decoder = pasts, rows, decoder
        self.stats = {"caches": 0, "rows": rows, "read_in_place": 0}

    def summary(self) -> dict:
        return dict(self.stats)

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        rewriter = _InPlace(mod.clone(), list(self.pasts), self.rows, self.stats)
        dtype = str(mod["main"].params[min(self.pasts)].ty.dtype)
        mod = rewrite_emitting(mod, rewriter)
        heads, dim = self.decoder["cache_shape"]
        layout = CacheLayout(tuple(self.pasts[i] for i in sorted(self.pasts)), heads, dim, self.rows, dtype,
                             frozenset(self.pasts[i] for i in rewriter.transposed or ()))
        self.decoder["cache"] = layout.to_json()
        return mod
