"""One fuzz case: compile with relaxc, run, compare with onnxruntime (in a worker process by
``check_in``, so a crash or a hang is recorded as an outcome instead of ending the run)."""

from __future__ import annotations

import traceback
from dataclasses import dataclass

import numpy as np
import onnx

from tests.isolated import Isolated

KINDS = ("pass", "refused", "mismatch", "error", "crash", "reference")
FAILURES = ("mismatch", "error", "crash")  # what the fuzzer shrinks and must end at zero


@dataclass(frozen=True)
class Outcome:
    """``pass``; ``refused``: a UserError before anything ran (a clear refusal, allowed);
    ``mismatch``: a wrong answer; ``error``: any other exception; ``crash``: the process died or
    hung; ``reference``: onnxruntime could not run the graph (a generator problem, not relaxc's)."""

    kind: str
    detail: str = ""

    def same_failure(self, other: "Outcome") -> bool:
        """Whether ``other`` still shows this failure (for shrinking): same kind, same exception type."""
        return self.kind == other.kind and (self.kind != "error" or
                                            self.detail.split(":")[0] == other.detail.split(":")[0])


def inputs_for(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    from relaxc.runtime import random_inputs

    specs = [(i.name, tuple(d.dim_value for d in i.type.tensor_type.shape.dim), "float32") for i in model.graph.input]
    return random_inputs(specs, seed)


def check(model: onnx.ModelProto) -> Outcome:
    """Compile ``model`` (no tuning), run it and onnxruntime on the same random inputs, compare."""
    import relaxc as compiler
    from relaxc.benchmarks import reference

    inputs = inputs_for(model)
    try:
        expected = reference.ort_run(model, inputs)
    except Exception as err:  # noqa: BLE001 - any failure of the reference is classified
        return Outcome("reference", _line(err))
    try:
        art = compiler.compile(model, target="cpu", tuning="off")
    except compiler.UserError as err:
        return Outcome("refused", _line(err))
    except Exception as err:  # noqa: BLE001
        return Outcome("error", f"{type(err).__name__}: {_line(err)} at {_where(err)}")
    try:
        actual = art.run(inputs)
        reference.assert_matches(actual, expected)
    except AssertionError as err:
        return Outcome("mismatch", " ".join(str(err).split())[:300])
    except Exception as err:  # noqa: BLE001
        return Outcome("error", f"{type(err).__name__} in run: {_line(err)}")
    return Outcome("pass")


def _line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0][:300]


def _where(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    return f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"


TIMEOUT_S = 300.0


def check_in(worker: Isolated, model: onnx.ModelProto) -> Outcome:
    """``check`` in ``worker`` (an ``Isolated(check)``): a crash or a hang becomes a ``crash``."""
    outcome, why = worker.call(model, TIMEOUT_S)
    return outcome if outcome is not None else Outcome("crash", why)
