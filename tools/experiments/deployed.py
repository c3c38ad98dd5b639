"""Exported builds against onnxruntime where only TVM's runtime is installed (``python -m tools.experiments.deployed``).

    .venv/bin/relaxc compile onnx:resnet50 --tuning strict -o /tmp/r50.so          # here
    .venv/bin/python -c "import onnx; from relaxc import frontend; \\
        onnx.save(frontend.load_model('onnx:resnet50')[0], '/tmp/r50.onnx')"      # the model as relaxc read it
    TVM_USE_RUNTIME_LIB=1 python -m tools.experiments.deployed /tmp/r50.onnx /tmp/r50.so [other.so ...]   # there

Why: to measure on a machine that has no compiler (another CPU, a quieter host) what a deployment
runs: the artifact loaded by TVM's runtime alone (``TVM_USE_RUNTIME_LIB=1``: no libtvm_compiler),
nothing of relaxc imported (``import relaxc`` needs TVM's compiler library: ``support/turns.py`` and
``benchmarks/reference.py`` are loaded by their paths). Each build and onnxruntime run with 2 threads,
taking turns in blocks (``turns.alternate``: a pause, a warm-up run, then the timed runs); outputs are
checked against onnxruntime first, with the project tolerance (``reference.assert_matches``). One table
row per set of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os

import numpy as np
import onnx

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)


def _standalone(path: str):
    """``path`` (a module of the repository) loaded by its path, without running ``relaxc``'s ``__init__``."""
    name = os.path.splitext(path)[0].replace(os.sep, "_")
    spec = importlib.util.spec_from_file_location(f"relaxc_{name}", os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(path: str, inputs: dict[str, np.ndarray]):
    """Two callables on the exported build at ``path`` (its manifest beside it): one inference, and one
    returning its first output as an array."""
    import tvm
    from tvm.runtime.vm import VirtualMachine

    with open(os.path.splitext(path)[0] + ".json") as f:
        names = [t["name"] for t in json.load(f)["inputs"]]
    vm = VirtualMachine(tvm.runtime.load_module(path), tvm.cpu())
    args = [tvm.runtime.tensor(inputs[name]) for name in names]
    first = lambda out: out if hasattr(out, "numpy") else out[0]  # noqa: E731
    return (lambda: vm["main"](*args)), (lambda: first(vm["main"](*args)).numpy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the .onnx model the builds were compiled from, weights filled")
    parser.add_argument("builds", nargs="+", help="exported builds (.so with their .json manifests)")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per runtime and set")
    parser.add_argument("--sets", type=int, default=3)
    args = parser.parse_args()
    os.environ["TVM_NUM_THREADS"] = "2"
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "2000")  # relaxc's default (support/threads.py)
    turns = _standalone(os.path.join("support", "turns.py"))
    reference = _standalone(os.path.join("benchmarks", "reference.py"))
    model = onnx.load(args.model)
    session = reference.ort_session(model, threads=2)
    rng = np.random.default_rng(0)
    inputs = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype("float32")
              for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}}
    expected = session.run(None, inputs)[:1]
    runs = {}
    for path in args.builds:
        run, output = _build(path, inputs)
        try:
            reference.assert_matches([output()], expected)
        except AssertionError as err:
            raise SystemExit(f"{path}: output differs from onnxruntime: {err}") from None
        runs[os.path.basename(path)] = run
    runs["onnxruntime"] = lambda: session.run(None, inputs)
    names = [n for n in runs if n != "onnxruntime"]
    print(f"onnxruntime {reference.onnxruntime().__version__}, 2 threads each, median of {args.repeat} per set\n")
    print("| " + " | ".join([*(f"{n} (ms)" for n in names), "onnxruntime (ms)", *(f"{n} / ort" for n in names)]) + " |")
    print("|" + " ---: |" * (2 * len(names) + 1))
    for _ in range(args.sets):
        ms = turns.alternate(runs, args.repeat)
        print("| " + " | ".join([*(f"{ms[n]:.2f}" for n in names), f"{ms['onnxruntime']:.2f}",
                                 *(f"{ms[n] / ms['onnxruntime']:.3f}x" for n in names)]) + " |", flush=True)


if __name__ == "__main__":
    main()
