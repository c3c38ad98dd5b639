"""ONNX backend node conformance: every node test case the onnx package generates, through relaxc.

    python -m tests.conformance --all            # the full suite (~1,900 cases)
    python -m tests.conformance --ops Conv Relu  # the cases built only from these operator types
    python -m tests.conformance --subset         # the fixed CI subset (tests/test_conformance.py)
    python -m tests.conformance --all --backends off   # relaxc's own kernels only

By default a case compiles as a user's model does (``backends="replay"``): what relaxc cannot
compile runs on an installed external backend (onnxruntime); the summary counts the passes of
relaxc's own kernels and the delegated ones apart.

Each case runs in a worker process (`tests/isolated.py`); a case that crashes the worker or outlives ``--timeout`` is
recorded as ``crash`` and the worker is replaced, so no case can stop the run. Outcomes:
``pass``, ``wrong`` (ran, output differs beyond the case's own rtol/atol), ``unsupported``
(relaxc refused it with a UserError, e.g. an operator the importer lacks), ``error`` (compile or
run raised anything else) and ``crash``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pickle
import queue
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field

from tqdm import tqdm

from tests.isolated import Isolated

# Operator types that relaxc must keep passing; CI runs every node case built only from them: CNN
# inference, then every op type the zoo's transformer and modern CNN exports contain, the standard
# Attention and Gelu (what newer exporters emit for the same models).
SUBSET_OPS = ("Add", "AveragePool", "BatchNormalization", "Clip", "Concat", "Conv", "Flatten",
              "Gemm", "GlobalAveragePool", "MaxPool", "Mul", "Relu", "Reshape", "Sigmoid",
              "Softmax", "Sum", "Transpose",
              "And", "Attention", "Cast", "Constant", "ConstantOfShape", "Div", "Equal", "Erf", "Expand",
              "Gather", "GatherElements", "Gelu", "GreaterOrEqual", "HardSigmoid", "HardSwish", "Identity",
              "IsNaN", "LayerNormalization", "MatMul", "Mod", "Not", "Pad", "Pow", "Range", "ReduceMean",
              "Resize", "ScatterND", "Shape", "Slice", "Split", "Sub", "Tanh", "Unsqueeze", "Where")
OUTCOMES = ("pass", "wrong", "unsupported", "error", "crash")
BACKENDS_VARIABLE = "RELAXC_CONFORMANCE_BACKENDS"  # the workers' backends mode

# Inputs that decide shapes (axes, pads, sizes, counts): the suite passes them as graph inputs, a
# static-shape compiler needs their values at compile time, as its users give them with
# ``constants=`` (``--constant``). A case input used only at these positions is bound so; any
# other input stays an input. op type -> input positions.
SHAPE_PARAMETERS = {
    **{op: (1,) for op in ("ReduceMax", "ReduceMin", "ReduceMean", "ReduceSum", "ReduceProd", "ReduceL1",
                           "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "Squeeze",
                           "Unsqueeze", "Reshape", "Expand", "Tile", "TopK", "Split", "OneHot", "CumSum",
                           "CumProd", "CenterCropPad", "Trilu", "Upsample")},
    "Pad": (1, 3), "Slice": (1, 2, 3, 4), "Resize": (1, 2, 3), "ConstantOfShape": (0,), "Range": (0, 1, 2),
    "Col2Im": (1, 2),
}


@dataclass
class Result:
    name: str
    ops: list[str]
    outcome: str
    detail: str = ""
    seconds: float = 0.0
    bound: list[str] = field(default_factory=list)  # inputs given to compile as constants (SHAPE_PARAMETERS)
    delegated: list[str] = field(default_factory=list)  # external backends that ran part of it


def collect(ops: set[str] | None = None) -> list:
    from onnx.backend.test.case.node import collect_testcases

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in collect_testcases() if c.kind == "node"]
    if ops is not None:
        cases = [c for c in cases if set(_case_ops(c)) <= ops]
    return sorted(cases, key=lambda c: c.name)


def _case_ops(case) -> list[str]:
    return sorted({n.op_type for n in case.model.graph.node})


def shape_parameters(graph) -> set[str]:
    """Graph inputs that every node reading them reads at a ``SHAPE_PARAMETERS`` position."""
    from relaxc.frontend.prepare import subgraph_inputs

    uses: dict[str, set[bool]] = collections.defaultdict(set)
    for node in graph.node:
        for index, name in enumerate(node.input):
            uses[name].add(node.domain in ("", "ai.onnx") and index in SHAPE_PARAMETERS.get(node.op_type, ()))
        for name in subgraph_inputs(node):  # a name a subgraph reads stays an input
            uses[name].add(False)
    outputs = {value.name for value in graph.output}
    return {value.name for value in graph.input if uses.get(value.name) == {True} and value.name not in outputs}


def run_case(path: str) -> dict:
    """Compile and run one pickled case in this process; returns the Result as a dict."""
    import numpy as np
    from onnx.backend.test.runner import Runner

    import relaxc
    from relaxc.frontend import graph_inputs

    with open(path, "rb") as f:
        case = pickle.load(f)
    if os.environ.get("RELAXC_CONFORMANCE_CRASH") == case.name:  # lets tests prove isolation
        os.kill(os.getpid(), signal.SIGSEGV)
    start = time.perf_counter()
    ops = _case_ops(case)

    inputs, expected = ([_array(v) for v in values] for values in case.data_sets[0])
    declared = graph_inputs(case.model.graph)
    fixed = shape_parameters(case.model.graph)
    constants = {value.name: array for value, array in zip(declared, inputs) if value.name in fixed}

    delegated: list[str] = []

    def result(outcome: str, detail: str = "") -> dict:
        return asdict(Result(case.name, ops, outcome, detail[:300], time.perf_counter() - start, sorted(constants),
                             delegated))

    # Bind dynamic inputs to the shape of their test data, as a user would with --shape.
    shapes = {value.name: np.shape(array) for value, array in zip(declared, inputs)
              if value.name not in fixed and any(not dim.dim_value for dim in value.type.tensor_type.shape.dim)}
    inputs = [array for value, array in zip(declared, inputs) if value.name not in fixed]
    try:
        art = relaxc.compile(case.model, shapes=shapes, constants=constants,
                               backends=os.environ.get(BACKENDS_VARIABLE, "replay"))
        delegated = sorted({sub["backend"] for sub in art.report()["backends"].get("subgraphs", [])})
    except relaxc.UserError as err:
        return result("unsupported", str(err))
    except Exception as err:  # anything else is a relaxc/TVM failure on a valid model
        return result("error", f"compile: {type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}")
    try:
        outputs = art.run(*inputs)
    except Exception as err:
        return result("error", f"run: {type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}")
    if len(outputs) != len(expected):
        return result("wrong", f"{len(outputs)} outputs, expected {len(expected)}")
    for index, (got, ref) in enumerate(zip(outputs, expected)):
        if isinstance(ref, list) != isinstance(got, list) or isinstance(ref, list) and len(ref) != len(got):
            return result("wrong", f"output {index}: {type(got).__name__}, expected a {type(ref).__name__}")
        for got_item, ref_item in (zip(got, ref) if isinstance(ref, list) else [(got, ref)]):
            got_item, ref_item = np.asarray(got_item), np.asarray(_array(ref_item))
            if got_item.shape != ref_item.shape or got_item.dtype != ref_item.dtype:
                return result("wrong", f"output {index}: {got_item.dtype}{got_item.shape}, expected "
                                       f"{ref_item.dtype}{ref_item.shape}")
            try:  # onnx's own backend runner's comparison (bfloat16: two ulps)
                Runner.assert_similar_outputs([ref_item], [got_item], rtol=case.rtol, atol=case.atol)
            except AssertionError as err:
                return result("wrong", f"output {index}: " + " ".join(str(err).split())[:200])
    return result("pass")


def _array(value):
    """A case's input or expected output as numpy: some cases store TensorProtos (bfloat16, float8,
    casts), which ``numpy_helper`` converts with ml_dtypes' types."""
    from onnx import TensorProto, numpy_helper

    return numpy_helper.to_array(value) if isinstance(value, TensorProto) else value


def _run_case_safely(path: str) -> dict:
    try:
        return run_case(path)
    except Exception:  # a bug in the runner itself: report it, keep serving
        return {"outcome": "error", "detail": traceback.format_exc(limit=1)}


def run_cases(cases: list, jobs: int = 2, timeout: float = 120.0, progress: bool = True,
              backends: str = "replay") -> list[Result]:
    """Run every case isolated in worker processes, compiled with ``backends``; returns one Result
    per case, in order."""
    results: dict[str, Result] = {}
    todo: queue.Queue = queue.Queue()
    with tempfile.TemporaryDirectory(prefix="relaxc-conformance-") as tmp:
        for index, case in enumerate(cases):
            path = os.path.join(tmp, f"{index}.pkl")
            with open(path, "wb") as f:
                pickle.dump(case, f)
            todo.put((case, path))
        lock = threading.Lock()
        bar = tqdm(total=len(cases), desc="conformance", unit="case", disable=not progress, dynamic_ncols=True)

        def serve() -> None:
            worker = Isolated(_run_case_safely, env={"TVM_NUM_THREADS": "1", BACKENDS_VARIABLE: backends})
            try:
                while True:
                    try:
                        case, path = todo.get_nowait()
                    except queue.Empty:
                        return
                    start = time.perf_counter()
                    reply, why = worker.call(path, timeout)
                    result = (Result(**reply) if reply and "name" in reply else
                              Result(case.name, _case_ops(case), "crash" if reply is None else "error",
                                     why or reply.get("detail", ""), time.perf_counter() - start))
                    with lock:
                        results[case.name] = result
                        bar.update()
            finally:
                worker.close()

        threads = [threading.Thread(target=serve) for _ in range(max(1, jobs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        bar.close()
    return [results[c.name] for c in cases]


def summarize(results: list[Result]) -> str:
    counts = collections.Counter(r.outcome for r in results)
    delegated = sum(1 for r in results if r.outcome == "pass" and r.delegated)
    lines = [f"{len(results)} cases: " + ", ".join(f"{counts[o]} {o}" for o in OUTCOMES),
             f"passing on relaxc's own kernels: {counts['pass'] - delegated}; with a part or all of the case "
             f"delegated to an external backend: {delegated}",
             f"passing with shape-parameter inputs given as constants: "
             f"{sum(1 for r in results if r.outcome == 'pass' and r.bound)}"]
    for outcome in OUTCOMES[1:]:
        ops = collections.Counter(op for r in results if r.outcome == outcome for op in r.ops)
        if ops:
            lines.append(f"{outcome}: " + ", ".join(f"{op} ({n})" for op, n in sorted(ops.items())))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every node case")
    which.add_argument("--subset", action="store_true", help=f"cases of {', '.join(SUBSET_OPS)}")
    which.add_argument("--ops", nargs="+", help="cases built only from these operator types")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per case (default 120)")
    parser.add_argument("--json", help="write every case's result to this file")
    parser.add_argument("--backends", default="replay", choices=("off", "rule", "replay"),
                        help="compile each case with this backends mode (default replay, as users do)")
    args = parser.parse_args(argv)
    ops = None if args.all else set(SUBSET_OPS if args.subset else args.ops)
    start = time.perf_counter()
    results = run_cases(collect(ops), jobs=args.jobs, timeout=args.timeout, backends=args.backends)
    print(summarize(results))
    print(f"wall time {time.perf_counter() - start:.0f}s")
    for r in results:
        if r.outcome != "pass":
            print(f"  {r.outcome:11s} {r.name}: {r.detail}")
        elif r.delegated:
            print(f"  delegated   {r.name}: {', '.join(r.delegated)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
