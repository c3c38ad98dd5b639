"""The real model architectures that ship inside the onnx package, addressable as ``onnx:<name>``.

The onnx package carries a handful of classic CNNs (with constant-filled weights and reference
outputs) in its backend test data; they are the bundled models relaxc compiles, tests and benchmarks
without downloading anything.
"""

from __future__ import annotations

import os

from support.errors import ModelError

PREFIX = "onnx:"
BUNDLED = (
    "resnet50",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "squeezenet",
    "shufflenet",
    "vgg19",
    "bvlc_alexnet",
    "zfnet512",
)


def _light_dir() -> str:
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def is_bundled(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def bundled_path(spec: str) -> str:
    """Path of the ONNX file for ``onnx:<name>``; raises ModelError naming the valid names."""
    name = spec[len(PREFIX):]
    if name not in BUNDLED:
        raise ModelError(f"unknown bundled model {spec!r}; choose one of: "
                         + ", ".join(PREFIX + n for n in BUNDLED))
    path = os.path.join(_light_dir(), f"light_{name}.onnx")
    if not os.path.exists(path):
        raise ModelError(f"bundled model {spec!r} is missing from the installed onnx package ({path})")
    return path
