"""Real model architectures bundled with relaxc, compiled, tested and benchmarked without downloads.

- ``onnx:<name>``: the classic CNNs that ship inside the onnx package's backend test data (with
  constant-filled weights).
- ``zoo:<name>``: real architectures exported from PyTorch by ``benchmarks/export_models.py``,
  committed in ``compiler/frontend/zoo/`` in their *light form*: every float weight is a shape-only
  placeholder recording the mean and standard deviation of the exported random weights, filled here
  with seeded normal values of that scale when the model is loaded. The graph is the exporter's own,
  byte for byte, so the importer sees what users bring.
"""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
from onnx import numpy_helper

from relaxc.support.errors import ModelError

PREFIX = "onnx:"
ZOO_PREFIX = "zoo:"
ZOO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zoo")
LIGHT_MARK = "relaxc:light"  # doc_string of a placeholder initializer: LIGHT_MARK mean=.. std=..
LIGHT_MIN_ELEMENTS = 64  # smaller float constants (scales, epsilons) keep their values
INPUT_HIGH_KEY = "relaxc.input_high"  # metadata: integer inputs' exclusive upper bound (token ids, masks)
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
    return isinstance(spec, str) and (spec.startswith(PREFIX) or spec.startswith(ZOO_PREFIX))


def zoo_names() -> list[str]:
    """The ``zoo:`` models committed in ``compiler/frontend/zoo/``."""
    return sorted(f[:-5] for f in os.listdir(ZOO_DIR) if f.endswith(".onnx"))


def bundled_path(spec: str) -> str:
    """Path of the ONNX file for ``onnx:<name>`` or ``zoo:<name>``; raises ModelError naming the
    valid names."""
    if spec.startswith(ZOO_PREFIX):
        name = spec[len(ZOO_PREFIX):]
        if name not in zoo_names():
            raise ModelError(f"unknown bundled model {spec!r}; choose one of: "
                             + ", ".join(ZOO_PREFIX + n for n in zoo_names()))
        return os.path.join(ZOO_DIR, f"{name}.onnx")
    name = spec[len(PREFIX):]
    if name not in BUNDLED:
        raise ModelError(f"unknown bundled model {spec!r}; choose one of: "
                         + ", ".join(PREFIX + n for n in BUNDLED))
    path = os.path.join(_light_dir(), f"light_{name}.onnx")
    if not os.path.exists(path):
        raise ModelError(f"bundled model {spec!r} is missing from the installed onnx package ({path})")
    return path


def make_light(model: onnx.ModelProto, source: str, input_high: dict[str, int] | None = None) -> onnx.ModelProto:
    """The light form of ``model``: float initializers that look like weights become placeholders
    (name, dtype and dims, no data) that record their mean and std, and so do those of one value
    throughout (LayerNorm's ones, a zero-initialised last convolution: std 0 fills them back exactly).
    Structural constants keep their values: masks (huge or infinite entries, or two values)."""
    light = onnx.ModelProto()
    light.CopyFrom(model)
    for init in light.graph.initializer:
        if init.data_type != onnx.TensorProto.FLOAT or int(np.prod(init.dims)) < LIGHT_MIN_ELEMENTS:
            continue
        values = numpy_helper.to_array(init).astype(np.float64)
        constant = bool(np.all(values == values.flat[0]))
        if not np.all(np.abs(values) < 1e3) or (len(np.unique(values[:4096])) <= 2 and not constant):
            continue
        placeholder = onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims,
                                       doc_string=f"{LIGHT_MARK} mean={values.mean():.9g} std={values.std():.9g}")
        init.CopyFrom(placeholder)
    light.doc_string = f"relaxc light model: {source}"
    if input_high:
        onnx.helper.set_model_props(light, {INPUT_HIGH_KEY: json.dumps(input_high)})
    return light


def is_light(model: onnx.ModelProto) -> bool:
    return any(init.doc_string.startswith(LIGHT_MARK) for init in model.graph.initializer)


def fill_light(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """``model`` with every placeholder filled with seeded normals of its recorded mean and std
    (the same values for the same seed, whatever the order tensors are filled in)."""
    filled = onnx.ModelProto()
    filled.CopyFrom(model)
    for index, init in enumerate(filled.graph.initializer):
        if not init.doc_string.startswith(LIGHT_MARK):
            continue
        stats = dict(part.split("=") for part in init.doc_string.split()[1:])
        rng = np.random.default_rng([seed, index])
        values = rng.normal(float(stats["mean"]), float(stats["std"]), tuple(init.dims)).astype(np.float32)
        init.CopyFrom(numpy_helper.from_array(values, init.name))
    return filled


def input_high(model: onnx.ModelProto) -> dict[str, int]:
    """Exclusive upper bounds of integer inputs a light model declares (token ids: the vocabulary)."""
    props = {p.key: p.value for p in model.metadata_props}
    return json.loads(props.get(INPUT_HIGH_KEY, "{}"))
