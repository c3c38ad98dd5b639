"""One fuzz case: compile with relaxc, run, compare with onnxruntime (in a worker process by
``check_in``, so a crash or a hang is recorded as an outcome instead of ending the run)."""

from __future__ import annotations

import json
import resource
import traceback
from dataclasses import dataclass

import numpy as np
import onnx

from tests.isolated import HUNG, Isolated

KINDS = ("pass", "refused", "mismatch", "error", "crash", "hang", "reference")
FAILURES = ("mismatch", "error", "crash", "hang")  # what the fuzzer shrinks and must end at zero
# onnxruntime's optimizer merges Q -> DQ -> Q into one quantization (its double-QDQ remover), which
# changes the values: quantized graphs are compared with the graph as written (docs/quantized.md)
# and int8 activations run on its int8 kernels only when told so (benchmarks/quantized.py)
QUANTIZED_SESSION = {"session.disable_double_qdq_remover": "1", "session.qdqisint8allowed": "1"}
QUANTIZED_EQUAL = 0.999  # of a quantized output's elements equal to onnxruntime's (docs/quantized.md)
QUANTIZED_STEPS = 1  # and the rest at most this many quantization steps apart
TIMEOUT_S = 120.0  # a graph's compile and run: seconds, unless something is wrong
MEMORY_BYTES = 4 << 30  # the worker's address space (its compiles take about 0.3 GB resident)


@dataclass(frozen=True)
class Outcome:
    """``pass``; ``refused``: a UserError before anything ran (a clear refusal, allowed);
    ``mismatch``: a wrong answer; ``error``: any other exception; ``crash``: the process died;
    ``hang``: no answer within ``TIMEOUT_S``; ``reference``: onnxruntime could not run the graph (a
    generator problem, not relaxc's). ``peak_mb``: the worker's largest resident size so far."""

    kind: str
    detail: str = ""
    peak_mb: float = 0.0

    def same_failure(self, other: "Outcome") -> bool:
        """Whether ``other`` still shows this failure (for shrinking): same kind, same exception type."""
        return self.kind == other.kind and (self.kind != "error" or
                                            self.detail.split(":")[0] == other.detail.split(":")[0])


def _extents(value: onnx.ValueInfoProto) -> list[int] | None:
    """An index input's valid extents (``generate.Graph.index_input``), None for a float input."""
    return json.loads(value.doc_string)["extents"] if value.type.tensor_type.elem_type == onnx.TensorProto.INT64 \
        else None


def inputs_for(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs: standard normals, and valid indices (negative ones included) for the index inputs."""
    from relaxc.runtime.runner import random_inputs

    rng = np.random.default_rng(seed)
    shape = lambda i: tuple(d.dim_value for d in i.type.tensor_type.shape.dim)  # noqa: E731
    inputs = random_inputs([(i.name, shape(i), "float32") for i in model.graph.input if _extents(i) is None], seed)
    for i in model.graph.input:
        extents = _extents(i)
        if extents is not None:
            high = np.array(extents).reshape((1,) * (len(shape(i)) - 1) + (-1,)) if len(extents) > 1 else extents[0]
            inputs[i.name] = (rng.random(shape(i)) * 2 * high - high).astype(np.int64)  # [-extent, extent)
    return inputs


def _needed(model: onnx.ModelProto) -> set[str]:
    """The tensors the graph's outputs depend on. An index input of a gather that no output needs is
    left out: onnxruntime still checks it, relaxc drops the gather and never reads it."""
    needed = {o.name for o in model.graph.output}
    for node in reversed(model.graph.node):
        if needed & set(node.output):
            needed |= set(node.input)
    return needed


def out_of_range(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The inputs with one index out of range, for each index input an output needs: just past
    either end, and huge."""
    variants, needed = [], _needed(model)
    for i in model.graph.input:
        extents = _extents(i)
        if extents is None or i.name not in needed:
            continue
        for bad in (extents[-1], -extents[-1] - 1, 2**62, -2**63):
            indices = inputs[i.name].copy()
            indices.flat[-1] = bad  # the last coordinate, for GatherND
            variants.append({**inputs, i.name: indices})
    return variants


def check(model: onnx.ModelProto, backends: str | None = None, target: str = "cpu") -> Outcome:
    """``compare(model, backends, target)`` with the process's peak resident memory."""
    outcome = compare(model, backends, target)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return Outcome(outcome.kind, outcome.detail, round(peak, 1))


def compare(model: onnx.ModelProto, backends: str | None = None, target: str = "cpu") -> Outcome:
    """Compile ``model`` (no tuning; ``backends``: relaxc's kernels only, or with the external
    backends too; None, the default mode, $RELAXC_BACKENDS as the suite sets it; for ``target``, this CPU or one it runs), run it and
    onnxruntime on the same random inputs, compare."""
    import relaxc
    from relaxc.benchmarks import reference

    inputs = inputs_for(model)
    quantized = any(node.op_type == "QuantizeLinear" for node in model.graph.node)
    try:
        expected = reference.ort_session(model, config=QUANTIZED_SESSION if quantized else None).run(None, inputs)
    except Exception as err:  # noqa: BLE001 - any failure of the reference is classified
        return Outcome("reference", _line(err))
    try:
        art = relaxc.compile(model, target=target, tuning="off", backends=backends)
    except relaxc.UserError as err:
        return Outcome("refused", _line(err))
    except Exception as err:  # noqa: BLE001
        return Outcome("error", f"{type(err).__name__}: {_line(err)} at {_where(err)}")
    try:
        actual = art.run(inputs)
        if quantized:
            try:
                assert_quantized_matches(model, actual, expected)
            except AssertionError as err:
                assert_rounding_explains(model, inputs, actual, backends, target, str(err))
        else:
            reference.assert_matches(actual, expected)
    except AssertionError as err:
        return Outcome("mismatch", " ".join(str(err).split())[:300])
    except Exception as err:  # noqa: BLE001
        return Outcome("error", f"{type(err).__name__} in run: {_line(err)}")
    for variant in out_of_range(model, inputs):
        outcome = _refused_alike(art, reference, model, variant)
        if outcome is not None:
            return outcome
    return Outcome("pass")


def assert_quantized_matches(model: onnx.ModelProto, actual: list[np.ndarray], expected: list[np.ndarray]) -> None:
    """A quantized model's outputs against onnxruntime's: where an output is a ``DequantizeLinear``,
    at least ``QUANTIZED_EQUAL`` of its elements equal and none more than ``QUANTIZED_STEPS`` steps
    of its scale apart (the float parts between Q/DQ pairs may round a value on a boundary the
    other way); any other output with the float tolerance."""
    from relaxc.benchmarks import reference
    from relaxc.benchmarks.quantized import agreement, output_step

    for index, (got, want) in enumerate(zip(actual, expected)):
        step = output_step(model, index)
        if step is None:
            reference.assert_matches([got], [want])
            continue
        equal, worst = agreement([got], [want], step)
        assert equal >= QUANTIZED_EQUAL and round(worst) <= QUANTIZED_STEPS, \
            f"output {index}: {100 * equal:.2f} % equal, {worst:.0f} steps apart at most"


def assert_rounding_explains(model: onnx.ModelProto, inputs: dict[str, np.ndarray], actual: list[np.ndarray],
                             backends: str | None, target: str, found: str) -> None:
    """Where a quantized model's outputs differ from onnxruntime's more than ``assert_quantized_matches``
    allows (``found``), whether relaxc's own quantized values explain it: relaxc's value of every
    ``QuantizeLinear`` (the model compiled again with them as outputs) as close to onnxruntime's as a
    quantized output must be, and onnxruntime, given those values in place of its own, computing
    relaxc's outputs. A float function of a value one ulp from a rounding boundary (a Softplus
    before a quantization, a Selu after it) is then one step of that value away, not wrong."""
    import relaxc
    from relaxc.benchmarks import reference
    from relaxc.benchmarks.quantized import agreement, with_quantized_outputs

    names = list(dict.fromkeys(node.output[0] for node in model.graph.node if node.op_type == "QuantizeLinear"))
    exposed = with_quantized_outputs(model)
    outputs = [value.name for value in exposed.graph.output]
    ours = dict(zip(outputs, relaxc.compile(exposed, target=target, tuning="off", backends=backends).run(inputs)))
    theirs = dict(zip(outputs, reference.ort_session(exposed, config=QUANTIZED_SESSION).run(None, inputs)))
    for name in names:
        equal, worst = agreement([ours[name]], [theirs[name]], 1.0)
        assert equal >= QUANTIZED_EQUAL and round(worst) <= QUANTIZED_STEPS, \
            f"{found}; quantized value {name}: {100 * equal:.2f} % equal, {worst:.0f} steps apart at most"
    values = [value for value in exposed.graph.output if value.name in names]
    given = reference.ort_session(_given(model, values), config=QUANTIZED_SESSION) \
        .run(None, inputs | {name: ours[name] for name in names})
    try:
        reference.assert_matches(actual, given)
    except AssertionError as err:
        raise AssertionError(f"{found}; onnxruntime given relaxc's quantized values: {err}") from None


def _given(model: onnx.ModelProto, values: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
    """``model`` with the nodes making ``values`` removed, those values graph inputs."""
    names = {value.name for value in values}
    given = onnx.ModelProto()
    given.CopyFrom(model)
    del given.graph.node[:]
    given.graph.node.extend(node for node in model.graph.node if node.output[0] not in names)
    given.graph.input.extend(values)
    return given


def _refused_alike(art, reference, model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> Outcome | None:
    """None if relaxc refuses an out-of-range index (InputError) where onnxruntime fails, and gives its
    answer where onnxruntime gives one (an index whose gather no output needs); else the mismatch."""
    import relaxc

    try:
        expected = reference.ort_run(model, inputs)
    except Exception:  # noqa: BLE001 - onnxruntime refuses the call
        expected = None
    try:
        actual = art.run(inputs)
    except relaxc.InputError:
        actual = None
    except Exception as err:  # noqa: BLE001
        return Outcome("error", f"{type(err).__name__} on an out-of-range index: {_line(err)}")
    if (expected is None) != (actual is None):
        return Outcome("mismatch", f"out-of-range index: onnxruntime {'refused' if expected is None else 'ran'}, "
                                   f"relaxc {'refused' if actual is None else 'ran'}")
    if expected is not None:
        try:
            reference.assert_matches(actual, expected)
        except AssertionError as err:
            return Outcome("mismatch", "out-of-range index: " + " ".join(str(err).split())[:280])
    return None


def _line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0][:300]


def _where(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    return f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"


def worker() -> Isolated:
    """A worker process for ``check_in``, its memory capped at ``MEMORY_BYTES``."""
    return Isolated(_check_job, memory=MEMORY_BYTES)


def _check_job(job: tuple[onnx.ModelProto, str, str]) -> Outcome:
    return check(*job)


def check_in(worker: Isolated, model: onnx.ModelProto, backends: str | None = None, target: str = "cpu") -> Outcome:
    """``check`` in ``worker`` (``worker()``): a worker that dies is a ``crash``, one that gives no
    answer within ``TIMEOUT_S`` a ``hang``."""
    outcome, why = worker.call((model, backends, target), TIMEOUT_S)
    return outcome if outcome is not None else Outcome("hang" if why.startswith(HUNG) else "crash", why)
