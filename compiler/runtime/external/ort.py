"""onnxruntime's CPU execution provider as a backend (``pip install 'relaxc[onnxruntime]'``)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from relaxc.runtime.external import KNOWN_WRONG_OPS, Backend, input_error, known_wrong


class OnnxRuntimeSession:
    """An ``InferenceSession`` whose threads do not spin waiting for work, so they do not take the
    cores from relaxc's kernels, unless it runs the whole model (spinning off made SqueezeNet 10.6 ms
    against 5.1); outputs written in place through an ``IOBinding`` (one per call: a binding is
    not thread-safe, the session is)."""

    def __init__(self, model: bytes, threads: int, ort: Any, spinning: bool) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        options.log_severity_level = 4  # its errors reach the caller as InputErrors, not on stderr
        self._session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self._inputs = [i.name for i in self._session.get_inputs()]
        self._outputs = [o.name for o in self._session.get_outputs()]
        self.outputs = len(self._outputs)
        self._error = ort.capi.onnxruntime_pybind11_state.Fail

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray] | None = None) -> list[Any]:
        try:
            if outputs is None:
                return self._session.run(None, dict(zip(self._inputs, inputs)))
            binding = self._session.io_binding()
            for name, array in zip(self._inputs, inputs):
                binding.bind_input(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
            for name, array in zip(self._outputs, outputs):
                binding.bind_output(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
            self._session.run_with_iobinding(binding)
            return list(outputs)
        except (self._error, RuntimeError, ValueError) as err:
            raise input_error("onnxruntime", err) from None


class OnnxRuntime(Backend):
    name = "onnxruntime"
    module = "onnxruntime"
    distributions = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml")
    extra = "onnxruntime"
    domains = frozenset({"ai.onnx", "ai.onnx.ml", "com.microsoft"})
    guarded = KNOWN_WRONG_OPS

    def refuses(self, node: Any, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
        return known_wrong(node, shapes)

    def session(self, model: bytes, threads: int, alone: bool = False) -> OnnxRuntimeSession:
        return OnnxRuntimeSession(model, threads, self.library(), alone)
