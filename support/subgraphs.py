"""A subgraph an external backend runs, as the front end makes it and an artifact keeps it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from relaxc.support.tensors import TensorSpec


@dataclass
class ExternalSubgraph:
    """An ONNX slice of the model, the backend that runs it, and where: a call inside relaxc's
    program, or the tail after it (outputs whose shapes depend on the data: shape None)."""

    backend: str
    inputs: list[str]
    outputs: list[TensorSpec]
    tail: bool
    model: bytes
    alone: bool = False  # the whole model: no kernel of relaxc's runs beside it
    # the whole model run instead of relaxc's program at the sizes whose work (the product of the
    # dynamic dims) is in [low, high): where another backend measured fastest (``serves``)
    serves: tuple[int, int] | None = None

    @property
    def function(self) -> str:
        """The packed function relaxc's program calls it by: one name per backend, slice and setting."""
        digest = hashlib.sha256(f"{self.backend}\0{self.alone}\0".encode() + self.model).hexdigest()[:20]
        return f"relaxc.runtime.external.{digest}"

    def boundary_bytes(self) -> int:
        """Bytes of the outputs it hands back whose size is known before it runs."""
        import numpy as np

        return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for _, shape, dtype in self.outputs
                   if shape is not None and dtype)
