"""The graph-level layout choice: the layout each op runs in, converters included, from measurements.

Left alone, the layout pass (``passes/layout.py``) runs every convolution it can in the target's
block and lets the other ops follow their inputs: right when that convolution is the fastest in
every layer and when converting into and out of it costs less than it saves. This module checks
both on the model at hand (docs/design.md, "The ideas relaxc is built on"): each convolution is
timed in every layout it can run in (NCHW and each candidate block), each converter on the real
tensor shapes, and ``passes/graph_choice.solve`` picks the assignment with the least total time,
which the layout pass then follows (its ``plan``).

What the model counts: convolutions cost their measured time in each layout, reading their input
in that layout (a blocked input of another block is converted, few input channels read in a small
block as the pass does); elementwise ops cost nothing in any layout (fused into their producer);
other ops (pools, normalisations, reductions, concats, gathers) cost the same in every blocked
layout they can run in (memory-bound over about the same bytes: padding's extra bytes are not
counted) and are not offered NCHW where they can run blocked: their NCHW forms are not measured,
and some are far slower (ConvNeXt's LayerNorm over C: 28 ms in NCHW, under 1 ms blocked). A value
read in a layout other than its own pays one measured converter per layout. An op can run blocked
in a layout where the layout pass, given that block for the whole graph, runs it blocked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import tvm
from tvm import relax

from relaxc.passes.ir import constant_array, is_op, static_shape
from relaxc.passes.layout import flatten_tuples, homes
from relaxc.passes.layout_algebra import REGISTRY, STANDARD, Layout, blocked, input_block, pack_conv_weight
from relaxc.passes.layout_rules import ELEMENTWISE
from relaxc.passes.graph_choice import Operator, Problem, Solution, solve

OUTPUT = "<outputs>"  # the operator that reads the function's results, in NCHW


class LayoutCosts(Protocol):
    """Measured times (ms) of the modules ``conv_module`` and ``converter_module`` make, by key;
    None where a time is unknown (not measured, and not to be). ``module`` makes the module to
    time (only called for a time not known already)."""

    def ms(self, key: str, module: Callable[[], tvm.IRModule]) -> float | None: ...


@dataclass
class Choice:
    """What the choice found: the plan for the layout pass and how it compares with the default."""

    plan: dict[relax.Var, Layout]  # for the layout pass
    solution: Solution
    default_cost: float  # the layout pass's own choice, costed the same way
    changed: dict[str, str]  # op -> layout, where the plan differs from the default

    def summary(self) -> dict:
        return {"method": self.solution.method, "ms": round(self.solution.cost, 4),
                "default_ms": round(self.default_cost, 4), "changed": self.changed}


def conv_module(call: relax.Call, layout: Layout) -> Callable[[], tvm.IRModule] | None:
    """What makes a module whose ``main`` runs the NCHW convolution ``call`` in ``layout`` on an
    input already in it; None where the weights are not constant or the layout cannot hold the
    groups. The weights are packed now, the module made when called."""
    array = constant_array(call.args[1])
    if array is None:
        return None
    attrs, channels = call.attrs, static_shape(call.args[0])[1]
    in_layout = layout if layout.standard else blocked(input_block(channels, layout.block))
    packed = None if layout.standard else pack_conv_weight(array, int(attrs.groups), in_layout.block, layout.block)
    if not layout.standard and packed is None:
        return None

    def conv(_bb: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
        if packed is None:
            return relax.Call(call.op, [x, call.args[1]], attrs, call.ty_args)
        kernel, kernel_layout, groups = packed
        return relax.op.nn.conv2d(x, relax.const(kernel), strides=attrs.strides, padding=attrs.padding,
                                  dilation=attrs.dilation, groups=groups, data_layout=in_layout.name,
                                  kernel_layout=kernel_layout, out_layout=layout.name, out_dtype=attrs.out_dtype)

    return lambda: _module(_laid_out(static_shape(call.args[0]), in_layout), conv)


def converter_module(shape: tuple[int, ...], source: Layout, target: Layout) -> tvm.IRModule:
    """A module whose ``main`` converts an NCHW ``shape`` tensor from ``source`` to ``target`` as
    the layout pass does (through NCHW)."""

    def convert(bb: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
        standard = x if source.standard else bb.emit(source.to_standard(x, shape[1]))
        return standard if target.standard else target.from_standard(standard)

    return _module(_laid_out(shape, source), convert)


def _laid_out(shape: tuple[int, ...], layout: Layout) -> tuple[int, ...]:
    n, c, h, w = shape
    return shape if layout.standard else (n, layout.padded(c) // layout.block, h, w, layout.block)


def _module(shape: tuple[int, ...], body: Callable[[relax.BlockBuilder, relax.Expr], relax.Expr]) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def _conv_key(call: relax.Call, layout: Layout) -> str:
    attrs = call.attrs
    fields = [static_shape(call.args[0]), static_shape(call.args[1]), tuple(attrs.strides), tuple(attrs.padding),
              tuple(attrs.dilation), (int(attrs.groups),)]
    return "conv2d-" + "-".join("x".join(str(int(v)) for v in f) for f in fields) + "-" + layout.name


def _is_conv(value: relax.Expr) -> bool:
    return (is_op(value, "relax.nn.conv2d") and value.attrs.data_layout == "NCHW"
            and constant_array(value.args[1]) is not None and static_shape(value.args[0]) is not None)


def _elementwise(value: relax.Expr) -> bool:
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in ELEMENTWISE


@dataclass
class LayoutProblem:
    """A module's layout problem: operators named uniquely (variable names may repeat), the
    variable each name stands for, and the layout pass's own choice (op name -> layout name)."""

    problem: Problem
    variables: dict[str, relax.Var]
    default: dict[str, str]


def build_problem(mod: tvm.IRModule, layouts: list[Layout], costs: LayoutCosts) -> LayoutProblem | None:
    """The layout problem of ``mod``'s main function, the layout pass's own choice being
    ``layouts[0]`` for the whole graph; None where a time is unknown."""
    runs = {layout.name: homes(mod, layout) for layout in layouts}
    default = runs[layouts[0].name]
    func = mod["main"]
    operators: list[Operator] = []
    names: dict[relax.Var, str] = {}  # tracked tensors -> operator name
    shapes: dict[str, tuple[int, ...]] = {}
    outputs: list[str] = []
    variables: dict[str, relax.Var] = {}

    def add(var: relax.Var, inputs: tuple[str, ...], costs_ms: dict[str, float]) -> str:
        name = var.name if var.name not in variables else f"{var.name}#{len(operators)}"
        operators.append(Operator(name, inputs, costs_ms))
        shapes[name], variables[name] = static_shape(var) or (), var
        return name

    for param in func.params:
        if param in default:
            names[param] = add(param, (), {STANDARD.name: 0.0})
    for block in func.body.blocks:
        for binding in block.bindings:
            var, value = binding.var, binding.value
            args = flatten_tuples(list(value.args) if isinstance(value, relax.Call) else [value])
            inputs = tuple(dict.fromkeys(names[a] for a in args if isinstance(a, relax.Var) and a in names))
            if not inputs and var not in default:
                continue
            priced = _priced(var, value, runs, default, costs)
            if priced is None:
                return None
            name = add(var, inputs, priced)
            if var in default and len(shapes[name]) == 4:
                names[var] = name
                if not isinstance(var, relax.DataflowVar):
                    outputs.append(name)
    if outputs:
        operators.append(Operator(OUTPUT, tuple(outputs), {STANDARD.name: 0.0}))
    converter_ms = _converter_times(operators, shapes, costs)
    if converter_ms is None:
        return None
    problem = Problem(operators, lambda producer, a, b: converter_ms[shapes[producer], a, b])
    chosen = {op.name: (home.name if (home := default.get(variables.get(op.name))) is not None
                        and home.name in op.costs else next(iter(op.costs))) for op in operators}
    return LayoutProblem(problem, variables, chosen)


def _priced(var: relax.Var, value: relax.Expr, runs: dict[str, dict[relax.Var, Layout]],
            default: dict[relax.Var, Layout], costs: LayoutCosts) -> dict[str, float] | None:
    """The layouts the op binding ``var`` may run in and its time in each (None: one unknown)."""
    offered = [name for name, run in runs.items() if run.get(var) is not None and run[var].name == name]
    if not offered or _is_conv(value) or _elementwise(value):  # see the module docstring
        offered.insert(0, STANDARD.name)
    if not _is_conv(value):
        return {name: 0.0 for name in offered}
    modules = {name: conv_module(value, REGISTRY[name]) for name in offered}
    if None in modules.values():  # a form only the layout pass builds (a windowed grouped conv)
        return {default[var].name: 0.0}
    priced = {name: costs.ms(_conv_key(value, REGISTRY[name]), module) for name, module in modules.items()}
    return None if None in priced.values() else priced


def _converter_times(operators: list[Operator], shapes: dict[str, tuple[int, ...]],
                     costs: LayoutCosts) -> dict[tuple, float] | None:
    """The time of every converter the problem may need, by (shape, from, to); None: one unknown."""
    layouts_of = {op.name: op.costs for op in operators}
    times: dict[tuple, float] = {}
    for op in operators:
        for producer in op.inputs:
            shape = shapes[producer]
            for source in layouts_of[producer]:
                for target in op.costs:
                    if source != target and (shape, source, target) not in times:
                        a, b = REGISTRY[source], REGISTRY[target]
                        ms = costs.ms(f"convert-{'x'.join(map(str, shape))}-{source}-{target}",
                                      lambda: converter_module(shape, a, b))
                        if ms is None:
                            return None
                        times[shape, source, target] = ms
    return times


def choose(mod: tvm.IRModule, layouts: list[Layout], costs: LayoutCosts) -> Choice | None:
    """The plan with the least total time (``layouts[0]``: the target's block), or None where a
    time is unknown."""
    built = build_problem(mod, layouts, costs)
    if built is None:
        return None
    problem, default = built.problem, built.default
    solution = solve(problem)
    default_cost = problem.total(default)
    if solution.cost >= default_cost - 1e-9:  # a tie keeps the layout pass's own choice
        solution = Solution(default, default_cost, solution.method)
    changed = {name: layout for name, layout in solution.choice.items() if layout != default[name]}
    plan = {built.variables[name]: REGISTRY[layout] for name, layout in solution.choice.items() if name != OUTPUT}
    return Choice(plan, solution, default_cost, changed)
