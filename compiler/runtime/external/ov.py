"""OpenVINO's CPU plugin as a backend (``pip install 'relaxc[openvino]'``)."""

from __future__ import annotations

import threading
from typing import Any, Mapping, Sequence

import numpy as np

from relaxc.runtime.external import KNOWN_WRONG_OPS, Backend, input_error, known_wrong


class OpenVinoSession:
    """A model compiled for OpenVINO's CPU plugin in float32 (its default on CPUs with bf16 or AMX
    would be bfloat16, another answer than the model's), one infer request per calling thread (a
    request is not thread-safe), outputs written in place through shared-memory tensors."""

    def __init__(self, model: bytes, threads: int, ov: Any) -> None:
        core = ov.Core()
        config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                  "INFERENCE_PRECISION_HINT": "f32", "NUM_STREAMS": 1}
        self._compiled = core.compile_model(core.read_model(model), "CPU", config)
        self._ov = ov
        self.outputs = len(self._compiled.outputs)
        self._local = threading.local()

    def _request(self) -> Any:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self._compiled.create_infer_request()
        return request

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray] | None = None) -> list[Any]:
        request = self._request()
        try:
            for index, array in enumerate(inputs):
                request.set_input_tensor(index, self._ov.Tensor(np.ascontiguousarray(array), shared_memory=True))
            if outputs is None:
                request.infer()
                return [request.get_output_tensor(i).data.copy() for i in range(self.outputs)]
            for index, array in enumerate(outputs):
                request.set_output_tensor(index, self._ov.Tensor(array, shared_memory=True))
            request.infer()
            return list(outputs)
        except RuntimeError as err:
            raise input_error("openvino", err) from None


class OpenVino(Backend):
    name = "openvino"
    module = "openvino"
    distributions = ("openvino",)
    extra = "openvino"
    domains = frozenset({"ai.onnx"})
    guarded = KNOWN_WRONG_OPS

    def refuses(self, node: Any, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
        return known_wrong(node, shapes)

    def session(self, model: bytes, threads: int, alone: bool = False) -> OpenVinoSession:
        return OpenVinoSession(model, threads, self.library())
