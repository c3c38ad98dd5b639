"""The ``relaxc`` command line (``python -m relaxc`` is the same).

Exit status: 0 on success, 2 on a user error (printed as one line, no traceback), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

from relaxc import text_commands
from relaxc.build.options import RENAMED, Options, TuneOptions
from relaxc.build.report import dispatch_summary, memory_summary, plan_summary, summary, tune_command
from relaxc.runtime.runner import random_inputs
from relaxc.support import tvm_log
from relaxc.support.errors import InputError, ShapeError, UserError

log = logging.getLogger("relaxc")


def _shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, tuple(int(d) for d in dims.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=D0,D1,... (e.g. input=1,3,224,224), got {text!r}") from None


def _size_arg(text: str) -> tuple[str, int]:
    name, sep, size = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, int(size)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=N (e.g. sequence=512), got {text!r}") from None


def _input_arg(text: str) -> tuple[str, str]:
    name, sep, path = text.rpartition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE.npy, got {text!r}")
    return name, path


def add_option_args(parser: argparse.ArgumentParser, options: type, exclude: tuple[str, ...] = (),
                    only: tuple[str, ...] | None = None) -> None:
    """A flag for each field of ``options`` (``Options``, ``TuneOptions``), but ``exclude`` (or
    just ``only``): name, help, type and choices all come from the field (``compiler/build/options.py``)."""
    for field in dataclasses.fields(options):
        if field.name in exclude or (only is not None and field.name not in only):
            continue
        meta = field.metadata
        flags = meta["flag"] or "--" + field.name.replace("_", "-")
        kwargs = {"dest": field.name, "default": field.default, "help": meta["help"]}
        if isinstance(field.default, bool):
            kwargs["action"] = "store_true"
        elif isinstance(field.default, tuple):
            kwargs.update(nargs="+", metavar=meta["metavar"])
        else:
            value_type = meta["type"] or (str if field.default is None else type(field.default))
            choices, metavar = meta["choices"], meta["metavar"]
            old = tuple(spelling for name, spelling in RENAMED if name == field.name)
            if old:  # accepted here, so that Options.resolve refuses it naming the new spelling
                choices, metavar = choices + old, metavar or "{" + ",".join(choices) + "}"
            kwargs.update(type=value_type, choices=choices, metavar=metavar)
        parser.add_argument(*([flags] if isinstance(flags, str) else flags), **kwargs)


def option_values(args: argparse.Namespace, *options: type) -> dict:
    """The values of the flags ``add_option_args`` added for these option classes, by field name."""
    values = {}
    for field in (f for cls in options for f in dataclasses.fields(cls)):
        if hasattr(args, field.name):
            value = getattr(args, field.name)
            values[field.name] = tuple(value) if isinstance(value, list) else value
    return values


def _add_model_args(parser: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    parser.add_argument("model", help="path to .onnx, or onnx:<name> for a bundled model")
    parser.add_argument("-t", "--target", default="cpu",
                        help="cpu (default, this machine), llvm, cuda[:sm_XY], rocm[:gfxNNN], or a JSON dict")
    parser.add_argument("--shape", action="append", type=_shape_arg, default=[], metavar="NAME=D0,D1,...",
                        help="bind an input's dynamic dims (repeatable)")
    parser.add_argument("--constant", action="append", type=_input_arg, default=[], metavar="NAME=FILE.npy",
                        help="fix an input at compile time to the array in a .npy file; the artifact no "
                             "longer takes it (repeatable)")
    parser.add_argument("--dim-bound", action="append", type=_size_arg, default=[], metavar="NAME=N",
                        help="keep the dynamic dim NAME (as the model names it) dynamic, up to N: one artifact "
                             "for every size (repeatable)")
    add_option_args(parser, Options, exclude)


def _add_input_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", action="append", type=_input_arg, default=[], metavar="NAME=FILE.npy",
                        help="input from a .npy file (repeatable); others are random")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument("--dim", action="append", type=_size_arg, default=[], metavar="NAME=N",
                        help="size of a dynamic dim in the random inputs (repeatable; default: its bound)")


def _shapes(args: argparse.Namespace) -> dict | None:
    shapes = dict(args.shape)
    if len(shapes) != len(args.shape):
        raise ShapeError("an input is given more than one --shape")
    return shapes or None


def _named_sizes(pairs: list[tuple[str, Any]], flag: str) -> dict[str, Any] | None:
    sizes = dict(pairs)
    if len(sizes) != len(pairs):
        raise ShapeError(f"a dim is given more than one {flag}")
    return sizes or None


def _constants(args: argparse.Namespace) -> dict[str, np.ndarray] | None:
    files = dict(args.constant)
    if len(files) != len(args.constant):
        raise InputError("an input is given more than one --constant")
    return {name: _load(path, f"--constant {name}={path}") for name, path in files.items()} or None


def _load(path: str, what: str) -> np.ndarray:
    try:
        return np.load(path)
    except (OSError, ValueError) as err:
        raise InputError(f"cannot read {what}: {err}") from None


def _compile(args: argparse.Namespace):
    from relaxc.build.pipeline import compile_model

    decoder = None
    if getattr(args, "max_length", None) is not None:
        decoder = {"max_length": args.max_length, "all_logits": getattr(args, "all_logits", False)}
        decoder |= {"max_batch": args.max_batch} if getattr(args, "max_batch", None) else {}
    return compile_model(args.model, args.target, _shapes(args), Options(**option_values(args, Options)),
                         _constants(args), _named_sizes(args.dim_bound, "--dim-bound"), decoder_options=decoder)


def _add_decoder_arg(p: argparse.ArgumentParser, all_logits: bool = True) -> None:
    p.add_argument("--max-length", type=int, metavar="N", help="compile a decoder with past to generate with: the "
                   "tokens a sequence may hold, prompt included (docs/generation.md)")
    if all_logits:
        p.add_argument("--all-logits", action="store_true", help="with --max-length: keep every prompt position's "
                       "logits, not the last position's alone")


def cmd_compile(args: argparse.Namespace) -> int:
    art = _compile(args)
    out = args.output or f"{art.report()['model'].replace('onnx:', '')}.so"
    manifest = art.export(out)
    report = art.report()
    print(f"compiled {report['model']} for {json.dumps(report['target'])} in {report['compile_seconds']:.1f}s")
    print(f"wrote {os.path.abspath(out)} and {manifest}")
    return 0


def _given_inputs(args: argparse.Namespace, names: list[str]) -> dict[str, np.ndarray]:
    """The ``--input`` arrays, each named input checked against the model's ``names`` first."""
    files = dict(args.input)
    unknown = sorted(set(files) - set(names))
    if unknown:
        raise InputError(f"--input names unknown input(s) {unknown}; the model's inputs are {names}")
    return {name: _load(path, f"--input {name}={path}") for name, path in files.items()}


def _model_inputs(args: argparse.Namespace) -> list[str]:
    """The inputs the compiled model will take, read from the ONNX file before compiling it: its
    graph inputs but those fixed by ``--constant``."""
    from relaxc import frontend

    proto = frontend.load_model(args.model)[0]
    fixed = {name for name, _ in args.constant}
    return [value.name for value in frontend.graph_inputs(proto.graph) if value.name not in fixed]


def _inputs_for(runner, given: dict[str, np.ndarray], seed: int, dims: list[tuple[str, int]] = ()) -> dict[str, np.ndarray]:
    """Random inputs (each dynamic dim at its bound, or at its ``--dim``) and the ``--input`` ones."""
    sizes = {**runner.dim_bounds, **(_named_sizes(list(dims), "--dim") or {})}
    unknown = sorted(set(sizes) - set(runner.dim_bounds))
    if unknown:
        raise ShapeError(f"--dim names dim(s) {unknown} the model does not have; its dynamic dims are "
                         f"{sorted(runner.dim_bounds) or 'none'}")
    arrays = random_inputs(runner.inputs, seed, runner.input_high, sizes)
    arrays.update(given)
    return arrays


def _check_phase(args: argparse.Namespace) -> None:
    from relaxc.build.pipeline import PHASE_NAMES

    if args.phase and args.phase not in PHASE_NAMES:
        raise UserError(f"unknown phase {args.phase!r}; choose one of {', '.join(PHASE_NAMES)}")


def cmd_run(args: argparse.Namespace) -> int:
    if args.model.endswith(".so"):
        import relaxc

        runner = relaxc.load(args.model, device=args.device)
        given = _given_inputs(args, [name for name, _, _ in runner.inputs])
        report = None
    else:
        given = _given_inputs(args, _model_inputs(args)) if args.input else {}  # usage errors before a compile
        runner = _compile(args)
        report = runner.report()
    inputs = _inputs_for(runner, given, args.seed, args.dim)
    outputs = runner.run(inputs)  # first run also warms up
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        runner.run(inputs)
        times.append((time.perf_counter() - start) * 1e3)
    latency = (f"median {statistics.median(times):.2f} ms, min {min(times):.2f} ms over {len(times)} runs"
               if times else None)
    if report is not None and args.json:
        print(json.dumps(report, indent=2))
        return 0
    if report is not None and args.report:
        print(summary(report, _tune_command(args, report), latency))
    for (name, _, _), value in zip(runner.outputs, outputs):
        print(f"output {name}: shape {tuple(value.shape)} {value.dtype} "
              f"sum {float(value.sum(dtype=np.float64)):.6g} mean|x| {float(np.abs(value).mean()):.6g}")
    if latency and not args.report:
        print(f"latency: {latency}")
    return 0


def _tune_command(args: argparse.Namespace, report: dict) -> str:
    return tune_command(args.model, report["target"], args.shape, args.cache_dir, args.constant,
                        report.get("dim_bounds"))


def cmd_inspect(args: argparse.Namespace) -> int:
    _check_phase(args)
    art = _compile(args)
    report = art.report()
    if args.memory:
        print(memory_summary(report["memory"], report.get("decoder")))
    elif args.show_dispatch:
        print(dispatch_summary(report.get("dispatch", {"choices": {}, "sources": {}, "convolutions": []})))
    elif args.plan:
        print(plan_summary(report["backends"]))
    elif args.json:
        print(json.dumps(report, indent=2))
    else:
        print(summary(report, _tune_command(args, report)))
    if args.phase:
        print(art.ir(args.phase))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from relaxc.build import profile, roofline

    given = _given_inputs(args, _model_inputs(args)) if args.input else {}
    art = _compile(args)
    machine = roofline.machine(art.target, args.cache_dir, remeasure=args.measure_machine,
                               strict=args.tuning == "strict")
    if art.decoder is not None:
        result, what = profile.decode_step(art, args.cached, machine, args.seed), f"one decode step with " \
            f"{args.cached} tokens cached"
    else:
        result, what = profile.profile(art, _inputs_for(art, given, args.seed, args.dim), machine), "one inference"
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        order = "by time lost against the roofline" if args.worst else "by time"
        print(f"{art.report()['model']} on {json.dumps(art.report()['target'])}, {what}, kernels timed alone, {order}:")
        print(result.table(args.top, worst=args.worst))
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    import relaxc

    summary = relaxc.tune(args.model, target=args.target, shapes=_shapes(args), constants=_constants(args),
                            dim_bounds=_named_sizes(args.dim_bound, "--dim-bound"),
                            tune_sizes=_named_sizes([(n, list(s)) for n, s in args.tune_sizes], "--tune-sizes"),
                            **option_values(args, Options, TuneOptions))
    print(json.dumps(summary, indent=2))
    return 0


def _list_stores(root: str, what: str) -> int:
    """Print the stores under ``root`` (``what`` they are); returns the problems found."""
    from relaxc.schedules import cache, maintenance

    keys = cache.stores(root)
    print(f"{what}: {root}" + ("" if keys else " (nothing cached)"))
    problems = 0
    for key in keys:
        info = maintenance.describe_store(root, key)
        print(f"  {key}: {info['records']} records for {info['workloads']} kernels, versions "
              f"{info['versions']}{'' if info['compatible'] else ' (NOT this TVM: never applied)'}")
        for fingerprint, entry in info["models"].items():
            print(f"    {entry.get('model')} [{fingerprint}] trials {entry.get('trials')}, "
                  f"{entry.get('minutes')} min, every kernel covered: {entry.get('complete')}")
        print(f"    {info['selected']} kernels with a schedule chosen by measurement (selected.json)")
        for name, count in info["measured"].items():
            if count:
                print(f"    {count} workloads measured in {name}")
        for bad in info["bad_lines"]:
            print(f"    unparsable line {bad}")
        if info["bad_selection"]:
            print(f"    invalid selection file {info['bad_selection']} (ignored: the best records apply)")
        for bad in info["bad_measurements"]:
            print(f"    {bad}")
        problems += (len(info["bad_lines"]) + (not info["compatible"]) + bool(info["bad_selection"])
                     + len(info["bad_measurements"]))
    return problems


def cmd_cache(args: argparse.Namespace) -> int:
    from relaxc.schedules import cache, maintenance

    root = cache.cache_root(args.cache_dir)
    if args.action in ("merge", "save", "load", "pack") and not args.path:
        raise UserError(f"relaxc cache {args.action} needs a PATH")
    if args.action == "list" or args.action == "verify":
        shipped = cache.shipped_root() if args.cache_dir is None else None
        layers = [(root, "your cache")] + ([(shipped, "beneath it, relaxc's")] if shipped else [])
        problems = sum(_list_stores(where, what) for where, what in layers)
        if not any(cache.stores(where) for where, _ in layers):
            return 0 if args.action == "list" else 1
        return 1 if args.action == "verify" and problems else 0
    if args.action == "merge":
        print(json.dumps(maintenance.merge(args.path, root)))
    elif args.action == "prune":
        for key, (before, after) in maintenance.prune(root).items():
            print(f"{key}: {before} -> {after} records (best per kernel)")
    elif args.action == "pack":
        print(f"packed {', '.join(maintenance.pack(root, args.path)) or 'no stores'} into {args.path}")
    elif args.action == "save":
        print(f"wrote {maintenance.save(args.path, root)}")
    else:
        print(json.dumps(maintenance.load(args.path, root)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relaxc", description="Compile ONNX models with Apache TVM.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", parents=[common], help="compile a model and export a shared library + manifest")
    _add_model_args(p)
    _add_decoder_arg(p)
    p.add_argument("-o", "--output", help="output .so (default: <model>.so here)")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", parents=[common], help="run a model or an exported .so on given or random inputs")
    _add_model_args(p)
    _add_input_args(p)
    p.add_argument("--repeat", type=int, default=10, help="timed runs after one warm-up (default 10)")
    p.add_argument("--report", action="store_true", help="print a summary of the compile report")
    p.add_argument("--json", action="store_true", help="print the whole compile report as JSON (and no more)")
    p.add_argument("--device", choices=("cpu", "cuda", "rocm"),
                   help="device to run an exported .so on (default: the one it was compiled for)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("inspect", parents=[common], help="print the compile report and the IR after a phase")
    _add_model_args(p)
    _add_decoder_arg(p)
    p.add_argument("--phase", help="print the IR after this phase (import, simplify, layout, ..., final)")
    p.add_argument("--memory", action="store_true",
                   help="print the memory plan (arena, lower bound, TVM's plan, biggest tensors) instead of the report")
    p.add_argument("--dispatch", action="store_true", dest="show_dispatch", help="print each convolution's candidates, their measured "
                   "cost and error, and the choice, instead of the report")
    p.add_argument("--plan", action="store_true", help="print the partition between relaxc and external backends "
                   "(each subgraph: backend, placement, ops, boundary bytes, why) and the measured times, "
                   "instead of the report")
    p.add_argument("--json", action="store_true", help="print the whole compile report as JSON")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("profile", parents=[common],
                       help="time each kernel of one inference: sorted, with share, schedule and kind")
    _add_model_args(p)
    _add_input_args(p)
    _add_decoder_arg(p, all_logits=False)
    p.add_argument("--cached", type=int, default=128, metavar="N",
                   help="with --max-length: the tokens cached before the decode step profiled (default 128)")
    p.add_argument("--top", type=int, default=25, help="kernels to list (default 25; 0: all)")
    p.add_argument("--worst", action="store_true",
                   help="sort by time lost against each kernel's roofline bound instead of by time")
    p.add_argument("--measure-machine", action="store_true",
                   help="measure this CPU's FMA peak and bandwidth again instead of reading them from the store")
    p.add_argument("--json", action="store_true", help="print every kernel as JSON")
    p.set_defaults(func=cmd_profile)

    text_commands.add_parsers(sub, common)

    p = sub.add_parser("tune", parents=[common], help="tune the model's kernels into the cache")
    _add_model_args(p, exclude=("tuning",))
    p.add_argument("--tune-sizes", action="append", type=_shape_arg, default=[], metavar="NAME=N,N,...",
                   help="with --dim-bound: tune each kernel of dynamic extents at these sizes of the dim NAME "
                        "(repeatable; every combination; a dim not named at its bound)")
    add_option_args(p, TuneOptions)
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("cache", parents=[common],
                       help="list, verify, merge, prune, pack, save or load the cache (docs/cache.md)")
    p.add_argument("action", choices=("list", "verify", "merge", "prune", "pack", "save", "load"))
    p.add_argument("path", nargs="?", help="merge: another cache; pack: the folder to write the "
                   "stores into as relaxc ships them; save/load: a .tar.gz archive")
    add_option_args(p, Options, only=("cache_dir",))
    p.set_defaults(func=cmd_cache)
    return parser


def run_command(prog: str, action: Callable[[], int], quiet: bool) -> int:
    """Run a command line's ``action`` with relaxc's progress logging (none if ``quiet``): a
    UserError ends it with one line on stderr and status 2, Ctrl-C with status 130."""
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO,
                        format="[relaxc] %(message)s", stream=tvm_log.console())
    try:
        return action()
    except UserError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command("relaxc", lambda: args.func(args), args.quiet)
