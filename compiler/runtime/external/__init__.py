"""External backends: libraries that run a subgraph of a model instead of relaxc's own kernels.

Each backend is a small class in a module of its own (``ort.py``: onnxruntime, ``ov.py``:
OpenVINO): whether it is installed, its version (fingerprinted and written in manifests), and a
``Session`` built from an ONNX slice that runs into buffers the caller owns (destination passing,
for a subgraph inside relaxc's program) or allocates its outputs (a subgraph whose output shapes
depend on the data, run after relaxc's program). A third backend is one more module and one entry
in ``BACKENDS``. The libraries are optional extras and imported only when a plan uses them.

A subgraph inside the program is a packed function the compiled code calls by name
(``relaxc.runtime.external.<digest>``); ``open_subgraph`` registers it in this process, at compile time and
again when an exported artifact is loaded. A session lives as long as something that runs it (a
``Runner``, a compile in progress) holds it: the candidates a measured choice built and dropped
free their libraries' memory and threads.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import threading
import weakref
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from relaxc.support.errors import InputError, UnsupportedOperatorError, UserError, message
from relaxc.support.subgraphs import ExternalSubgraph


class Session(Protocol):
    """One ONNX slice, built for a backend; ``run`` may be called from many threads at once."""

    outputs: int

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray] | None = None) -> list[Any]:
        """Run on ``inputs``; write into ``outputs`` when given (their shapes are the slice's),
        else return what the backend allocated."""


class Backend:
    """What relaxc needs of an external library; subclasses fill in the names and ``session``."""

    name: str  # as users write it: backends=..., backend_overrides
    module: str  # the Python module that must import
    distributions: tuple[str, ...]  # the pip distributions that install it, in order of preference
    extra: str  # pip extra of relaxc that installs it
    domains: frozenset[str]  # the ONNX operator domains it runs ("ai.onnx" for the default one)
    guarded: frozenset[str] = frozenset()  # op types with forms it answers differently from ONNX (``refuses``)

    def installed(self) -> bool:
        return importlib.util.find_spec(self.module) is not None

    def library(self) -> Any:
        """The library's module; a UserError naming the extra where it is not installed."""
        if not self.installed():
            raise UserError(f"the {self.name} backend is not installed: pip install 'relaxc[{self.extra}]'")
        return importlib.import_module(self.module)

    def version(self) -> str:
        """The installed distribution's version, read from its metadata: importing the library to ask
        it made a compile replaying a decision for relaxc's kernels 1.11x slower (ResNet-18)."""
        for distribution in self.distributions:
            try:
                return importlib.metadata.version(distribution)
            except importlib.metadata.PackageNotFoundError:
                continue
        return str(self.library().__version__)

    def session(self, model: bytes, threads: int, alone: bool = False) -> Session:
        """``model`` built to run on ``threads`` threads; ``alone``: no kernel of relaxc's runs beside
        it, so its threads may wait for work spinning."""
        raise NotImplementedError

    def refuses(self, node: Any, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
        """Why it would answer this node (an ``onnx.NodeProto`` of a ``guarded`` type) differently
        from ONNX, or None; ``shapes``: the model's static shapes by value name. A backend pinned
        by ``backend_overrides`` runs the node anyway."""
        return None


# Forms onnxruntime 1.32 and OpenVINO 2026.4 both answer differently from the ONNX node suite's
# expected outputs (measured: python -m tests.conformance --all): never placed there unpinned.
KNOWN_WRONG_OPS = frozenset({"Dropout", "Resize", "MaxUnpool", "DFT", "STFT"})


def known_wrong(node: Any, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """Why both libraries would answer ``node`` (an ``onnx.NodeProto``) differently from ONNX, or None."""
    attrs = {a.name: a for a in node.attribute}
    if node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
        return "a training-mode Dropout draws its own random mask"
    if node.op_type == "MaxUnpool" and len(node.input) > 2 and node.input[2]:
        return "MaxUnpool with output_shape places values elsewhere than ONNX"
    if node.op_type in ("DFT", "STFT"):
        return (f"its float32 {node.op_type} is off by up to 6e-7 of the largest output (onnxruntime) or "
                f"fails (OpenVINO), beyond the ONNX suite's tolerance for outputs near zero")
    transform = attrs["coordinate_transformation_mode"].s if "coordinate_transformation_mode" in attrs else b""
    mode = attrs["mode"].s if "mode" in attrs else b"nearest"
    if node.op_type == "Resize" and transform == b"align_corners" and mode in (b"linear", b"cubic"):
        before, after = shapes.get(node.input[0]), shapes.get(node.output[0])
        if before is None or after is None or any(b > a for b, a in zip(before, after)):
            return "a linear or cubic align_corners Resize that shrinks an axis gives other values"
    return None


def backends() -> dict[str, Backend]:
    """Every backend relaxc knows, by name, in the order ``fallback`` prefers them."""
    from relaxc.runtime.external.ort import OnnxRuntime
    from relaxc.runtime.external.ov import OpenVino

    return {b.name: b for b in (OnnxRuntime(), OpenVino())}


def get(name: str) -> Backend:
    known = backends()
    if name not in known:
        raise UserError(f"unknown backend {name!r}; relaxc knows {', '.join(['relaxc', *known])}")
    return known[name]


def installed() -> list[str]:
    """Names of the external backends importable here, in order of preference."""
    return [name for name, backend in backends().items() if backend.installed()]


_OPEN: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def open_subgraph(subgraph: ExternalSubgraph, threads: int) -> Session:
    """The subgraph's session, one per process while something holds it (the caller must: the
    process keeps only a weak reference). A call's is registered as the packed function relaxc's
    program calls (one name per backend and slice, so one registration serves every artifact of
    the process holding that slice)."""
    import tvm_ffi

    name = subgraph.function
    with _LOCK:
        session = _OPEN.get(name)
        if session is not None:
            return session
        backend = get(subgraph.backend)
        try:
            session = backend.session(subgraph.model, threads, subgraph.alone)
        except UserError:
            raise
        except Exception as err:  # noqa: BLE001 - each library raises its own kinds
            raise UnsupportedOperatorError(f"{backend.name} cannot build the subgraph given to it: "
                                           f"{message(err)}") from None
        if not subgraph.tail:
            count = len(subgraph.inputs)
            held = weakref.ref(session)

            def run(*tensors: Any) -> None:
                live = held()
                if live is None:
                    raise RuntimeError(f"{name} runs after every artifact holding its session was dropped")
                arrays = [np.from_dlpack(t) for t in tensors]
                live.run(arrays[:count], arrays[count:])

            tvm_ffi.register_global_func(name, run, override=True)
        _OPEN[name] = session
        return session


def input_error(backend: str, err: Exception) -> InputError:
    """An error the backend raised on the values it was given, in relaxc's words."""
    return InputError(f"the {backend} subgraph refused its input: {message(err)}")
