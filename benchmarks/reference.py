"""onnxruntime as the independent reference, and the project's tolerance.

Used by the tests and by the benchmarks, which check outputs before they time anything. The
tolerance is the project's (docs/design.md, "Correctness") and must not be widened to make a
result pass: ``rtol=1e-3`` and ``atol=1e-4 * max(1, max|reference|)``. onnxruntime is an optional
dependency (``pip install relaxc[test]``). Nothing of relaxc is imported when the module loads, so
``tools/experiments/deployed.py`` loads it by its path where only TVM's runtime is installed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

ORT_MAX_IR_VERSION = 8  # onnxruntime rejects IR versions newer than it knows


def onnxruntime():
    """The onnxruntime module, or a UserError that says how to get it."""
    try:
        import onnxruntime as ort
    except ImportError:
        from relaxc.support.errors import UserError

        raise UserError("onnxruntime is not installed; install relaxc[test] to compare against it") from None
    return ort


def ort_session(model: onnx.ModelProto, threads: int = 2, profile_prefix: str | None = None,
                optimized_path: str | None = None, config: dict[str, str] | None = None, optimize: bool = True):
    """An onnxruntime CPU session; ``profile_prefix``: profile every node into a file named so;
    ``optimized_path``: write the model as onnxruntime optimised it there; ``config``: session
    configuration entries; ``optimize=False``: no graph optimisations (each node on its own kernel)."""
    ort = onnxruntime()
    model = _ort_compatible(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    if optimized_path:
        options.optimized_model_filepath = optimized_path
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _ort_compatible(model: onnx.ModelProto) -> onnx.ModelProto:
    if model.ir_version <= ORT_MAX_IR_VERSION:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.ir_version = ORT_MAX_IR_VERSION
    return copy


def ort_run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort_session(model).run(None, inputs)


def assert_matches(actual: list[np.ndarray], expected: list[np.ndarray]) -> None:
    """Compare outputs with the project tolerance; the message says where and by how much."""
    assert len(actual) == len(expected), f"{len(actual)} outputs, reference has {len(expected)}"
    for index, (got, ref) in enumerate(zip(actual, expected)):
        assert got.shape == ref.shape, f"output {index}: shape {got.shape}, reference {ref.shape}"
        atol = 1e-4 * max(1.0, float(np.abs(ref).max(initial=0.0)))
        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=atol, err_msg=f"output {index}")


def randomize_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Replace the constant-filled weights of a bundled light model by random initializers.

    The light models build every weight with ConstantOfShape (a constant fill), which hides layout
    and indexing bugs. Weights get fan-in scaled normals so deep nets keep activations in range;
    batch-norm scales and variances are kept positive.
    """
    rng = np.random.default_rng(seed)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.ir_version = max(copy.ir_version, 4)  # IR 3 requires every initializer to be an input too
    graph = copy.graph
    initializers = {init.name: init for init in graph.initializer}
    role = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            role.setdefault(name, (node.op_type, index, node))
    nodes = []
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in initializers:
            nodes.append(node)
            continue
        shape = tuple(int(v) for v in numpy_helper.to_array(initializers[node.input[0]]).reshape(-1))
        op, index, consumer = role.get(node.output[0], ("", 0, None))
        if op == "BatchNormalization" and index in (1, 4):
            value = rng.uniform(0.5, 1.5, shape)
        elif len(shape) >= 2:
            transposed = op == "Gemm" and not any(a.name == "transB" and a.i for a in consumer.attribute)
            fan_in = shape[0] if transposed else int(np.prod(shape[1:]))
            value = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        else:
            value = rng.standard_normal(shape) * 0.1
        graph.initializer.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
    del graph.node[:]
    graph.node.extend(nodes)
    return copy


class OrtDecoder:
    """onnxruntime running a decoder with past as its own loop does (``session``: its
    InferenceSession; ``pairs``: its (past input, present output) names): each step's presents fed
    back as the next step's pasts, positions counted over the mask as transformers counts them.
    ``append`` and ``step`` return the last position's logits (``append``: every position's if
    ``all_positions``), as a relaxc session's do."""

    def __init__(self, session, pairs: list[tuple[str, str]]) -> None:
        self.session, self.pairs = session, pairs
        self.names = {i.name: i for i in session.get_inputs()}
        self.outputs = [o.name for o in session.get_outputs()]

    def append(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None,
               all_positions: bool = False) -> np.ndarray:
        """The prompt at once (a fresh cache)."""
        shape = self.names[self.pairs[0][0]].shape
        self.past = {name: np.zeros((len(input_ids), shape[1], 0, shape[3]), np.float32) for name, _ in self.pairs}
        self.mask = np.zeros((len(input_ids), 0), np.int64)
        logits = self._run(input_ids.astype(np.int64),
                           np.ones_like(input_ids) if attention_mask is None else attention_mask)
        return logits if all_positions else logits[:, -1]

    def step(self, tokens: np.ndarray) -> np.ndarray:
        ids = np.asarray(tokens, np.int64).reshape(-1, 1)
        return self._run(ids, np.ones_like(ids))[:, -1]

    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        self.mask = np.concatenate([self.mask, mask.astype(np.int64)], axis=1)
        feeds = {"input_ids": ids, "attention_mask": self.mask, **self.past}
        if "position_ids" in self.names:
            feeds["position_ids"] = np.maximum(np.cumsum(self.mask, axis=1) - 1, 0)[:, -ids.shape[1]:]
        produced = dict(zip(self.outputs, self.session.run(None, feeds)))
        self.past = {name: produced[present] for name, present in self.pairs}
        return produced["logits"]


def ort_greedy(session, input_ids: np.ndarray, attention_mask: np.ndarray, new_tokens: int,
               pairs: list[tuple[str, str]]) -> tuple[np.ndarray, list[np.ndarray]]:
    """onnxruntime's own greedy loop (``OrtDecoder``): the prompt at once, then one token per step.
    Returns the tokens [batch, prompt + new] and each step's logits."""
    decoder = OrtDecoder(session, pairs)
    logits = [decoder.append(input_ids, attention_mask)]
    tokens = [np.argmax(logits[-1], axis=-1)]
    while len(tokens) < new_tokens:
        logits.append(decoder.step(tokens[-1]))
        tokens.append(np.argmax(logits[-1], axis=-1))
    return np.concatenate([input_ids, np.stack(tokens, axis=1)], axis=1).astype(np.int64), logits


def teacher_forced(session, decoder: OrtDecoder, prompt: np.ndarray, steps: int) -> list[float]:
    """``session`` (a relaxc generation session) and onnxruntime's ``decoder`` run the same ``prompt``, then
    ``steps`` one-token steps, each fed onnxruntime's greedy token (teacher-forced: one wrong step does not
    change what the next ones are given). Returns each call's largest logit difference relative to
    max|logit| of onnxruntime's, the prompt's first (infinite where relaxc's are not finite)."""
    ours, theirs = session.append(prompt), decoder.append(prompt)
    errors = []
    for step in range(steps + 1):
        finite = np.isfinite(ours).all()
        errors.append(float(np.abs(ours - theirs).max() / np.abs(theirs).max()) if finite else float("inf"))
        if step < steps:
            forced = np.argmax(theirs, axis=-1)
            ours, theirs = session.step(forced), decoder.step(forced)
    return errors
