"""A decoder's weights in a file beside its library, mapped into memory when it loads.

The export writes every weight the programs take (``passes/weights.py``) into ``<library>.weights``:
the arrays' bytes one after another, each at an offset that is a multiple of ``ALIGNMENT``, and
their offsets, shapes and types in the manifest. Loading maps the file copy-on-write and hands
TVM views of it (``from_dlpack``: no copy), so the weights are in memory once, as the page cache's
pages of the file, and only the pages a kernel reads come in.
"""

from __future__ import annotations

import os

import numpy as np
import tvm
import tvm_ffi

from relaxc.support.errors import ExportError
from relaxc.support.files import Staging, file_sha256

ALIGNMENT = 64  # bytes: TVM's tensor alignment, which from_dlpack needs to share memory


def write(tensors: list[tvm.runtime.Tensor], library: str, staging: Staging) -> dict:
    """Write ``tensors`` beside ``library`` (a staged file); returns the manifest's entry for them."""
    name = os.path.splitext(os.path.basename(library))[0] + ".weights"
    staged = staging.path(os.path.join(os.path.dirname(library), name))
    arrays, offset = [], 0
    with open(staged, "wb") as f:
        for tensor in tensors:
            array = tensor.numpy()
            f.write(b"\0" * (-offset % ALIGNMENT))
            offset += -offset % ALIGNMENT
            arrays.append({"offset": offset, "shape": list(array.shape), "dtype": str(array.dtype)})
            array.tofile(f)  # C-contiguous, as numpy() makes it
            offset += array.nbytes
    return {"file": name, "sha256": file_sha256(staged), "bytes": offset, "arrays": arrays}


def read(folder: str, entry: dict, device: tvm.runtime.Device) -> list[tvm.runtime.Tensor]:
    """The tensors of the weights file ``entry`` describes (its manifest entry), mapped from
    ``folder``; a file of another size is an ExportError (its digest is checked with the library's)."""
    path = os.path.join(folder, entry["file"])
    if not os.path.isfile(path) or os.path.getsize(path) != entry["bytes"]:
        raise ExportError(f"{path} is missing or not the {entry['bytes']} bytes export wrote: the artifact's "
                          "weights; re-export the model")
    mapped = np.memmap(path, np.uint8, mode="c")  # copy-on-write: writable views, for DLPack, never written
    tensors = []
    for array in entry["arrays"]:
        dtype = np.dtype(array["dtype"])
        size = int(np.prod(array["shape"])) * dtype.itemsize
        view = mapped[array["offset"]:array["offset"] + size].view(dtype).reshape(array["shape"])
        tensors.append(tvm.runtime.from_dlpack(view) if device.dlpack_device_type() == tvm.cpu().dlpack_device_type()
                       else tvm.runtime.tensor(view, device))
    return tensors


def as_argument(tensors: list[tvm.runtime.Tensor]) -> tvm_ffi.Array:
    """``tensors`` as the programs' last argument, a tuple."""
    return tvm_ffi.convert(tensors)
