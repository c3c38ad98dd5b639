"""A language model's tied embedding read from its output layer's packed panels (a pass of the layout phase).

GPT-2 and OPT tie the token embedding to the output layer: optimum exports ``Gather(E, ids)`` and
``MatMul(h, Transpose(E))`` over one table E ``[vocab, hidden]``. ``PackDenseWeights`` packs E's
transpose into column panels ``[ceil(vocab / panel), hidden, panel]`` for the product, and the gather
kept reading E: two copies of the largest weight (GPT-2 124M: 154 MB of 498). Here a gather of a table
whose transpose a packed product reads becomes ``take_panels``, reading each token's row from the
panels (``hidden`` loads ``panel`` floats apart), and E itself is left to dead-code elimination.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te
from tvm.ir import GenericConst

from relaxc.passes.ir import constant_array, is_op, rewrite_emitting


def take_panels(packed: te.Tensor, ids: te.Tensor) -> te.Tensor:
    """Rows ``ids`` of the table whose transpose ``packed`` holds in column panels: (*ids, hidden)."""
    _, depth, panel = packed.shape

    def row(*index):
        token = ids[index[:-1]]
        return packed[token // panel, index[-1], token % panel]

    return te.compute((*ids.shape, depth), row, name="take_panels")


def _panels(mod: tvm.IRModule) -> list[GenericConst]:
    """The packed weights of the ``dense_packed`` kernels the Relax functions call, each once (a
    decoder's two programs share them)."""
    found: dict[GenericConst, None] = {}
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                call = binding.value
                if is_op(call, "relax.call_tir") and call.args[0].name_hint.startswith("dense_packed") \
                        and isinstance(call.args[1], relax.Tuple) and len(call.args[1].fields) == 2 \
                        and isinstance(call.args[1].fields[1], GenericConst):
                    found[call.args[1].fields[1]] = None
    return list(found)


def _holds_transpose(packed: np.ndarray, table: np.ndarray) -> bool:
    """Whether ``packed`` is ``table``'s transpose in column panels (zero columns past its rows),
    panel by panel: an untied output layer of the same shape differs in its first."""
    rows, depth = table.shape
    blocks, reach, panel = packed.shape
    if reach != depth or not (blocks - 1) * panel < rows <= blocks * panel:
        return False
    return all(np.array_equal(packed[b, :, :min(panel, rows - b * panel)], table[b * panel:(b + 1) * panel].T)
               for b in range(blocks))


@relax.expr_functor.mutator
class _Tied(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, panels: list[GenericConst], stats: dict) -> None:
        super().__init__(mod)
        arrays = [(p, constant_array(p)) for p in panels]
        self.panels = [(p, a) for p, a in arrays if a is not None and a.ndim == 3 and a.dtype == np.float32]
        self.stats = stats
        self.tables: dict[GenericConst, GenericConst | None] = {}  # each table compared once

    def _packed(self, table: GenericConst) -> GenericConst | None:
        if table not in self.tables:
            values = constant_array(table)
            self.tables[table] = None if values is None or values.ndim != 2 or values.dtype != np.float32 else next(
                (p for p, packed in self.panels if _holds_transpose(packed, values)), None)
        return self.tables[table]

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not is_op(call, "relax.take") or call.attrs.mode != "fast" or call.attrs.axis is None \
                or int(call.attrs.axis) != 0 or not isinstance(call.args[0], GenericConst):
            return call
        packed = self._packed(call.args[0])
        if packed is None:
            return call
        self.stats["tied_embeddings"] += 1
        return self.builder_.call_te(take_panels, packed, call.args[1], primfunc_name_hint="take_panels")


@tvm.transform.module_pass(opt_level=0, name="relaxc.TiedEmbeddings")
class TiedEmbeddings:
    """Gathers from a table whose transpose a packed product reads read its panels instead;
    ``summary()`` (``report()["tied"]``) counts them."""

    report_key = "tied"

    def __init__(self) -> None:
        self.stats = {"tied_embeddings": 0}

    def summary(self) -> dict:
        return dict(self.stats)

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.stats = {"tied_embeddings": 0}
        panels = _panels(mod)
        return rewrite_emitting(mod, _Tied(mod.clone(), panels, self.stats)) if panels else mod
