"""Where one model's compile costs more under one set of options than another: phase by phase, then
kernel by kernel (``python -m tools.experiments.build_costs``).

    .venv/bin/python -m tools.experiments.build_costs onnx:squeezenet --before-options dispatch=off \
        --after-options dispatch=replay --options tuning=replay [--rounds 5] [--top 10]

All in one process, so both sides pay the same imports and warm-ups: the two sides are compiled in
turns ``--rounds`` times and each phase's median printed (``report()["phases"]``); then each side's
kernels are built on one thread in the groups the build phase deals them into
(``parallel.kernel_groups``; the sides taking turns), the CPU seconds that phase spreads over the
cores; then the ``--top`` kernels of the second side that are slowest to build alone, each split
into ``tvm.tirx.build`` (TIR passes, LLVM IR and its optimisation) and machine code (emitted at the
first lookup), beside the median kernel of the first side. A module built alone pays about 15 ms
that a group shares (Zen 4), so the kernel lines overstate what each adds to a compile; the grouped
totals do not.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass

import tvm

import relaxc
from tools.experiments.compile_times import add_option_arguments, option_sides
from relaxc.build.codegen import parallel
from relaxc.frontend import ModelLike
from relaxc.passes.tir import tir_pipeline
from relaxc.support import tvm_internals
from relaxc.support.threads import physical_cores


def _build(group: tvm.IRModule, target: tvm.target.Target) -> tuple[float, float]:
    """Seconds of ``tvm.tirx.build`` and of the machine code for the kernels of ``group``."""
    start = time.perf_counter()
    lib = tvm.tirx.build(group, target=target, pipeline=tir_pipeline.pipeline(target))
    built = time.perf_counter()
    lib.get_function(group.get_global_vars()[0].name_hint)
    return built - start, time.perf_counter() - built


def _alone(kernels: tvm.IRModule, name: str, target: tvm.target.Target, repeat: int = 3) -> tuple[float, float]:
    """The fastest of ``repeat`` builds of kernel ``name`` in a module of its own."""
    gv = kernels.get_global_var(name)
    one = tvm.IRModule({gv: kernels[gv]}, attrs=kernels.attrs)
    return min((_build(one, target) for _ in range(repeat)), key=sum)


@dataclass
class BuildCosts:
    """What ``measure`` found; seconds throughout."""

    phases: dict[str, tuple[float, float]]  # phase -> medians (before, after), "whole compile" first
    grouped: tuple[float, float]  # each side's kernels built on one thread in the build phase's groups
    kernels: tuple[int, int]  # each side's kernel count
    typical: float  # the first side's median kernel built alone
    slowest: list[tuple[str, float, float]]  # the second side's kernels built alone: name, tirx.build, machine code


def measure(model: ModelLike, sides: list[dict], rounds: int = 5, top: int = 10) -> BuildCosts:
    """Compile ``model`` (anything ``relaxc.compile`` takes) with each of the two option sets in
    ``sides``, taking turns ``rounds`` times, and build their kernels as the module docstring says."""
    phases: list[dict[str, list[float]]] = [{}, {}]
    artifacts = [None, None]
    for _ in range(rounds):
        for side, options in enumerate(sides):
            start = time.perf_counter()
            artifacts[side] = relaxc.compile(model, **options)
            phases[side].setdefault("whole compile", []).append(time.perf_counter() - start)
            for phase in artifacts[side].report()["phases"]:
                phases[side].setdefault(phase["name"], []).append(phase["seconds"])
    medians = {name: tuple(statistics.median(p.get(name, [0.0])) for p in phases) for name in phases[1]}

    target = tvm.target.Target(artifacts[1].report()["target"])
    kernels = [tvm_internals.kernels_only(a.module("lower")) for a in artifacts]
    groups = [parallel.kernel_groups(k, physical_cores()) for k in kernels]
    grouped: list[list[float]] = [[], []]
    for _ in range(rounds):
        for side in (0, 1):
            grouped[side].append(sum(sum(_build(g, target)) for g in groups[side]))
    names = [sorted(gv.name_hint for gv in k.get_global_vars()) for k in kernels]
    typical = statistics.median(sum(_alone(kernels[0], n, target)) for n in names[0])
    alone = [(n, *_alone(kernels[1], n, target)) for n in names[1]]
    return BuildCosts(medians, (statistics.median(grouped[0]), statistics.median(grouped[1])),
                      (len(names[0]), len(names[1])), typical, sorted(alone, key=lambda k: -k[1] - k[2])[:top])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="onnx:NAME for a bundled model, or a path to an .onnx file")
    parser.add_argument("--rounds", type=int, default=5, help="compiles per side, taking turns (median)")
    parser.add_argument("--top", type=int, default=10, help="kernels of the second side listed")
    add_option_arguments(parser)
    args = parser.parse_args(argv)
    sides = list(option_sides(args))
    costs = measure(args.model, sides, args.rounds, args.top)
    print(f"{args.model}, {sides[0]} against {sides[1]}, medians of {args.rounds} compiles (s)\n")
    print("| phase | before | after | difference |\n| --- | ---: | ---: | ---: |")
    for name, (before, after) in costs.phases.items():
        print(f"| {name} | {before:.3f} | {after:.3f} | {after - before:+.3f} |")
    print(f"\nkernels built on one thread in the build phase's groups (CPU s, median of {args.rounds}): "
          f"before {costs.grouped[0]:.3f} ({costs.kernels[0]} kernels), after {costs.grouped[1]:.3f} "
          f"({costs.kernels[1]} kernels)\n")
    print(f"slowest kernels of the second side to build alone (s; the first side's median kernel: "
          f"{costs.typical:.3f})\n")
    print("| kernel | tirx.build | machine code | total |\n| --- | ---: | ---: | ---: |")
    for name, build, code in costs.slowest:
        print(f"| {name} | {build:.3f} | {code:.3f} | {build + code:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
