"""External subgraphs spliced into relaxc's imported program as calls.

relaxc's part of a partitioned model (``partition.py``) is imported with the calls' outputs as
extra parameters and the calls' inputs as extra results. Here each call becomes a
``call_dps_packed`` of the packed function that runs it (``relaxc.runtime.external``): its outputs are
bound where the parameters were, its inputs are no longer returned. The call is a standard-layout
operator to the layout pass and its outputs are planned by the arena like any kernel's.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import tvm
from tvm import relax

from relaxc.support.errors import UnsupportedOperatorError
from relaxc.support.tensors import TensorSpec


@dataclass(frozen=True)
class Call:
    function: str  # the packed function's global name
    inputs: list[str]
    outputs: list[TensorSpec]


def splice(mod: tvm.IRModule, parameters: list[str], results: list[str], kept: list[str],
           calls: list[Call]) -> tvm.IRModule:
    """``mod``'s main (parameters and results named in order by ``parameters`` and ``results``)
    with each call's outputs computed by the call, returning the values named by ``kept``."""
    main = mod["main"]
    blocks = list(main.body.blocks)
    if len(blocks) != 1 or not isinstance(blocks[0], relax.DataflowBlock):
        raise UnsupportedOperatorError("relaxc's part of this model imports with control flow "
                                       "around an external subgraph: not supported yet")
    bindings = list(blocks[0].bindings)
    returned = main.body.body
    tuple_binding = next((b for b in bindings if b.var.same_as(returned) and isinstance(b.value, relax.Tuple)), None)
    fields = list(tuple_binding.value.fields) if tuple_binding is not None else [returned]
    if tuple_binding is not None:
        bindings.remove(tuple_binding)
    value = dict(zip(results, fields))
    param = dict(zip(parameters, main.params))
    made = {name for call in calls for name, _, _ in call.outputs}
    ordered = _ordered(bindings, [_binding(call, value, param) for call in calls])
    named = [value[n] if n in value else param[n] for n in kept]
    result = named[0] if len(named) == 1 else relax.Tuple(named)
    out = relax.Var("gv", relax.BlockBuilder().normalize(result).ty)
    ordered.append(relax.VarBinding(out, result))
    params = [p for name, p in param.items() if name not in made]
    function = relax.Function(params, relax.SeqExpr([relax.DataflowBlock(ordered)], out), out.ty,
                              main.is_pure, main.attrs, main.span)
    function = function.with_attr("num_input", len(params))
    mod = mod.clone()
    mod["main"] = function
    return relax.transform.Normalize()(mod)


def _binding(call: Call, value: dict, param: dict) -> list[relax.Binding]:
    """The call, and each output bound to the parameter that stood for it."""
    args = relax.Tuple([value[n] if n in value else param[n] for n in call.inputs])
    types = [relax.TensorType(shape, dtype) for _, shape, dtype in call.outputs]
    expr = relax.BlockBuilder().normalize(relax.call_dps_packed(call.function, args, types))
    if len(types) == 1:
        return [relax.VarBinding(param[call.outputs[0][0]], expr)]
    whole = relax.DataflowVar("external", expr.ty)
    return [relax.VarBinding(whole, expr)] + [relax.VarBinding(param[name], relax.TupleGetItem(whole, index))
                                              for index, (name, _, _) in enumerate(call.outputs)]


def _ordered(bindings: list[relax.Binding], calls: list[list[relax.Binding]]) -> list[relax.Binding]:
    """The bindings and calls in an order where each value is bound before it is used: the
    importer's order, each call as soon as its inputs are bound."""
    groups = [[b] for b in bindings] + calls
    defines = {b.var: g for g, group in enumerate(groups) for b in group}
    needs = [{defines[v] for b in group for v in relax.analysis.free_vars(b.value) if v in defines} - {g}
             for g, group in enumerate(groups)]
    users: list[list[int]] = [[] for _ in groups]
    for g, deps in enumerate(needs):
        for d in deps:
            users[d].append(g)
    waiting = [len(d) for d in needs]
    ready = [(_rank(g, len(bindings), needs), g) for g in range(len(groups)) if not waiting[g]]
    heapq.heapify(ready)
    ordered: list[relax.Binding] = []
    while ready:
        _, g = heapq.heappop(ready)
        ordered += groups[g]
        for u in users[g]:
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, (_rank(u, len(bindings), needs), u))
    if len(ordered) != sum(len(g) for g in groups):
        raise AssertionError("external subgraphs and relaxc's part depend on each other in a cycle")
    return ordered


def _rank(group: int, bindings: int, needs: list[set[int]]) -> float:
    """Bindings keep their place; a call ranks just after the last binding it needs."""
    if group < bindings:
        return float(group)
    return max((d for d in needs[group] if d < bindings), default=-1) + 0.5
