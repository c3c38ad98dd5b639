"""The graph-level layout choice against brute force on small graphs with made-up costs."""

import itertools

import numpy as np
import pytest

from relaxc.passes.graph_choice import Operator, Problem, solve

LAYOUTS = ("NCHW", "NCHW8c", "NCHW16c")

# name -> inputs; each graph in topological order, "x" the graph input
GRAPHS = {
    "chain": {"x": (), "a": ("x",), "b": ("a",), "c": ("b",), "d": ("c",), "e": ("d",)},
    "residual block": {"x": (), "a": ("x",), "b": ("a",), "c": ("b",), "add": ("a", "c"), "d": ("add",)},
    "two residual blocks": {"x": (), "a": ("x",), "b": ("a",), "add1": ("a", "b"), "c": ("add1",),
                            "add2": ("add1", "c"), "d": ("add2",)},
    "concat": {"x": (), "a": ("x",), "b1": ("a",), "b2": ("a",), "c2": ("b2",), "b3": ("a",),
               "cat": ("b1", "c2", "b3"), "d": ("cat",)},
    "dense block": {"x": (), "a": ("x",), "b": ("a",), "cat1": ("a", "b"), "c": ("cat1",),
                    "cat2": ("a", "b", "c"), "d": ("cat2",)},
}


def random_problem(graph: dict, rng: np.random.Generator) -> Problem:
    """Operators with random costs in a random subset of the layouts (the input only in NCHW),
    converters with random costs per value and pair of layouts."""
    operators = []
    for name, inputs in graph.items():
        layouts = ("NCHW",) if not inputs else [l for l in LAYOUTS if rng.random() < 0.8] or ["NCHW16c"]
        operators.append(Operator(name, inputs, {l: float(rng.uniform(0, 10)) for l in layouts}))
    table = {(v, a, b): float(rng.uniform(0, 4)) for v in graph for a in LAYOUTS for b in LAYOUTS}
    return Problem(operators, lambda value, a, b: table[value, a, b])


def brute_force(problem: Problem) -> float:
    names = [op.name for op in problem.operators]
    return min(problem.total(dict(zip(names, layouts)))
               for layouts in itertools.product(*(list(op.costs) for op in problem.operators)))


@pytest.mark.parametrize("graph", GRAPHS)
def test_exact_elimination_matches_brute_force(graph):
    rng = np.random.default_rng(0)
    for _ in range(40):
        problem = random_problem(GRAPHS[graph], rng)
        solution = solve(problem)
        assert solution.method == "exact"
        assert solution.cost == pytest.approx(brute_force(problem), abs=1e-9)
        assert solution.cost == pytest.approx(problem.total(solution.choice))


@pytest.mark.parametrize("graph", GRAPHS)
def test_approximation_is_exact_on_chains_and_bounded_elsewhere(graph):
    """With no table allowed (max_table=1) the recursion runs: exact on the chain; elsewhere never
    better than the optimum (it is a real assignment) and never worse than the best single layout
    for every operator that has it (a local optimum of one-operator changes)."""
    rng = np.random.default_rng(1)
    gaps = []
    for _ in range(40):
        problem = random_problem(GRAPHS[graph], rng)
        solution = solve(problem, max_table=1)
        optimum = brute_force(problem)
        assert solution.method == "approximate"
        assert solution.cost >= optimum - 1e-9
        for op in problem.operators:  # no single change improves it
            for layout in op.costs:
                assert problem.total({**solution.choice, op.name: layout}) >= solution.cost - 1e-9
        gaps.append(solution.cost - optimum)
    if graph == "chain":
        assert max(gaps) == pytest.approx(0, abs=1e-9)


def test_converting_wins_where_it_pays():
    """An operator much faster in another layout runs there when the converters cost less than it
    saves, and stays when they cost more."""
    def problem(converter_cost: float) -> Problem:
        ops = [Operator("x", (), {"NCHW16c": 0.0}),
               Operator("a", ("x",), {"NCHW16c": 1.0}),
               Operator("b", ("a",), {"NCHW16c": 5.0, "NCHW8c": 2.0}),
               Operator("c", ("b",), {"NCHW16c": 1.0})]
        return Problem(ops, lambda _v, a, b: 0.0 if a == b else converter_cost)

    cheap, dear = solve(problem(1.0)), solve(problem(2.0))
    assert cheap.choice["b"] == "NCHW8c" and cheap.cost == pytest.approx(1 + 2 + 1 + 2)
    assert dear.choice["b"] == "NCHW16c" and dear.cost == pytest.approx(7)


def test_one_converter_per_value_and_layout():
    """Two consumers reading a value in the same other layout share its converter."""
    ops = [Operator("x", (), {"A": 0.0}), Operator("p", ("x",), {"B": 1.0}), Operator("q", ("x",), {"B": 1.0})]
    problem = Problem(ops, lambda _v, a, b: 3.0)
    assert solve(problem).cost == pytest.approx(1 + 1 + 3)


def test_problem_refuses_a_graph_out_of_order():
    with pytest.raises(ValueError, match="not an operator before it"):
        Problem([Operator("a", ("b",), {"A": 0.0}), Operator("b", (), {"A": 0.0})], lambda *_: 0.0)
