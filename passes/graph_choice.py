"""The graph-level layout choice: each operator runs in one of its layouts, a value read in a layout
other than the one it was produced in pays a converter, and the total is minimised.

Why a solver of its own: choosing each operator's fastest layout alone ignores the converters
between them (docs/design.md, "The ideas relaxc is built on"), and trying every assignment is
exponential. The total is a sum of operator costs (one variable each) and, per value, the
converters its consumers need (a term over the producer and its consumers: one converter per value
and layout, shared by every consumer that reads it, as ``passes/layout.py`` inserts them).

How, ``solve``:
- exact, by variable elimination: dynamic programming over the graph in an elimination order
  (on a chain, the Viterbi recursion). Exact on any graph; its tables grow with the graph's width,
  which stays small on chains, residual joins and Inception's branches.
- approximate, where a table would exceed ``max_table`` entries (DenseNet's concats of up to 48
  earlier values): the forward recursion of NeoCPU's and AutoTVM's graph tuners, in topological
  order, each input's best cost counted once per consumer (a producer shared by several consumers
  is counted for each: exact on chains and trees, an estimate on joins); the choice read back from
  the outputs; then improved one operator at a time with the exact total until no single change
  lowers it. ``Solution.method`` says which ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

MAX_TABLE = 1 << 16  # entries of the largest table exact elimination may build


@dataclass(frozen=True)
class Operator:
    """One operator: the operators whose values it reads, and its cost in each layout it can run in
    (it reads its inputs and writes its value in that layout)."""

    name: str
    inputs: tuple[str, ...]
    costs: Mapping[str, float]


# (producing operator, from layout, to layout) -> cost of converting its value
Converter = Callable[[str, str, str], float]


@dataclass
class Problem:
    """Operators in topological order and the cost of converting a value between two layouts."""

    operators: list[Operator]
    convert: Converter
    consumers: dict[str, list[str]] = field(init=False)

    def __post_init__(self) -> None:
        self.consumers = {}
        for op in self.operators:
            for producer in dict.fromkeys(op.inputs):  # add(x, x) reads x once
                if producer not in self.consumers:
                    raise ValueError(f"{op.name} reads {producer}, which is not an operator before it")
                self.consumers[producer].append(op.name)
            if not op.costs:
                raise ValueError(f"{op.name} has no layout to run in")
            self.consumers[op.name] = []

    def conversions(self, producer: str, layout: str, read_in: set[str]) -> float:
        """Cost of the converters ``producer``'s value needs when produced in ``layout`` and read in
        the layouts ``read_in``: one per other layout."""
        return sum(self.convert(producer, layout, other) for other in read_in - {layout})

    def total(self, choice: Mapping[str, str]) -> float:
        """The cost of running every operator in the layout ``choice`` gives it."""
        return sum(op.costs[choice[op.name]] + self.converters(op.name, choice) for op in self.operators)

    def converters(self, producer: str, choice: Mapping[str, str]) -> float:
        """Cost of the converters the value of ``producer`` needs under ``choice``."""
        return self.conversions(producer, choice[producer], {choice[c] for c in self.consumers[producer]})


@dataclass(frozen=True)
class Solution:
    choice: dict[str, str]  # operator -> layout
    cost: float
    method: str  # "exact" or "approximate"


def solve(problem: Problem, max_table: int = MAX_TABLE) -> Solution:
    """The assignment of layouts with the least total cost (see the module docstring)."""
    choice = _eliminate(problem, max_table)
    method = "exact"
    if choice is None:
        choice, method = _improve(problem, _recursion(problem)), "approximate"
    return Solution(choice, problem.total(choice), method)


# --- exact: variable elimination -------------------------------------------------------------------
Factor = tuple[tuple[str, ...], np.ndarray]  # variables, table with one axis per variable


def _eliminate(problem: Problem, max_table: int) -> dict[str, str] | None:
    """The optimal choice, or None where some table would exceed ``max_table`` entries."""
    domains = {op.name: tuple(op.costs) for op in problem.operators}
    factors: list[Factor] = [((op.name,), np.array([op.costs[l] for l in domains[op.name]], float))
                             for op in problem.operators]
    for producer, consumers in problem.consumers.items():
        if consumers:
            factor = _converter_factor(problem, domains, producer, consumers, max_table)
            if factor is None:
                return None
            factors.append(factor)
    tables: dict[int, Factor] = dict(enumerate(factors))
    touching: dict[str, set[int]] = {v: set() for v in domains}  # variable -> the tables over it
    for i, (scope, _) in tables.items():
        for v in scope:
            touching[v].add(i)

    def scope_of(variable: str) -> tuple[str, ...]:  # the variables sharing a table with it, it included
        return tuple(dict.fromkeys(u for i in sorted(touching[variable]) for u in tables[i][0]))

    def size(scope: tuple[str, ...]) -> int:
        return math.prod(len(domains[u]) for u in scope)

    sizes = {v: size(scope_of(v)) for v in domains}  # of the table eliminating v would make
    eliminated: list[tuple[str, tuple[str, ...], np.ndarray]] = []  # variable, the rest, its best index
    while sizes:
        variable = min(sizes, key=lambda v: (sizes[v], v))
        scope = scope_of(variable)
        if size(scope) > max_table:
            return None
        table = sum(_expand(tables[i], scope, domains) for i in sorted(touching[variable]))
        axis = scope.index(variable)
        rest = scope[:axis] + scope[axis + 1:]
        for i in touching.pop(variable):
            for v in tables.pop(i)[0]:
                if v != variable:
                    touching[v].discard(i)
        tables[len(eliminated) + len(factors)] = (rest, table.min(axis))
        for v in rest:
            touching[v].add(len(eliminated) + len(factors))
        eliminated.append((variable, rest, table.argmin(axis)))
        del sizes[variable]
        for v in rest:
            sizes[v] = size(scope_of(v))
    choice: dict[str, str] = {}
    for variable, rest, best in reversed(eliminated):
        choice[variable] = domains[variable][best[tuple(domains[v].index(choice[v]) for v in rest)]]
    return choice


def _converter_factor(problem: Problem, domains: dict[str, tuple[str, ...]], producer: str,
                      consumers: list[str], max_table: int) -> Factor | None:
    """The converters of ``producer``'s value as a table over it and its consumers."""
    scope = (producer, *consumers)
    shape = tuple(len(domains[v]) for v in scope)
    if math.prod(shape) > max_table:
        return None
    table = np.empty(shape)
    for index in np.ndindex(*shape):
        read_in = {domains[c][i] for c, i in zip(consumers, index[1:])}
        table[index] = problem.conversions(producer, domains[producer][index[0]], read_in)
    return scope, table


def _expand(factor: Factor, scope: tuple[str, ...], domains: dict[str, tuple[str, ...]]) -> np.ndarray:
    """``factor``'s table with its axes in ``scope``'s order, size 1 along the variables it lacks."""
    variables, table = factor
    order = sorted(range(len(variables)), key=lambda i: scope.index(variables[i]))
    shape = [len(domains[v]) if v in variables else 1 for v in scope]
    return table.transpose(order).reshape(shape)


# --- approximate: the graph tuners' recursion, then local improvement ---------------------------------
def _recursion(problem: Problem) -> dict[str, str]:
    """Forward: each operator's best cost per layout, every input's own best counted in full; back:
    from the outputs, each producer's layout given its consumers' (exact on chains and trees)."""
    best: dict[str, dict[str, float]] = {}
    for op in problem.operators:
        best[op.name] = {
            layout: cost + sum(min(b + problem.conversions(p, pl, {layout}) for pl, b in best[p].items())
                               for p in dict.fromkeys(op.inputs))
            for layout, cost in op.costs.items()}
    choice: dict[str, str] = {}
    for op in reversed(problem.operators):
        read_in = {choice[c] for c in problem.consumers[op.name]}
        choice[op.name] = min(best[op.name], key=lambda l: best[op.name][l] + problem.conversions(op.name, l, read_in))
    return choice


def _improve(problem: Problem, choice: dict[str, str]) -> dict[str, str]:
    """``choice`` changed one operator at a time while that lowers the exact total."""
    producers = {op.name: list(dict.fromkeys(op.inputs)) for op in problem.operators}

    def local(op: Operator) -> float:  # the terms of the total that depend on op's layout
        return op.costs[choice[op.name]] + sum(problem.converters(p, choice) for p in [op.name, *producers[op.name]])

    improved = True
    while improved:
        improved = False
        for op in problem.operators:
            current, before = choice[op.name], local(op)
            for layout in op.costs:
                choice[op.name] = layout
                if local(op) < before - 1e-12:
                    current, before, improved = layout, local(op), True
            choice[op.name] = current
    return choice
