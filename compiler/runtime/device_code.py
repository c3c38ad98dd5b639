"""Device code of exported GPU artifacts: how it is loaded (``build/codegen/fatbins.py`` writes it).

ROCm: the library holds the AMDGPU code object (hsaco) TVM linked at build time.
CUDA: TVM 0.27 keeps the kernels as CUDA C and compiles them when the library is loaded, which
would need a compiler on the machine that runs the model. At export relaxc compiles each CUDA
module's source with nvcc into a fatbin (SASS for the target arch plus its PTX, which newer GPUs
JIT) written beside the library; at load it answers TVM's compile callback with that fatbin,
checked against the source's sha256, so loading never compiles and never uses a stale binary.
"""

from __future__ import annotations

import hashlib
import os

import tvm_ffi

from relaxc.support.errors import ExportError

CUDA_CALLBACK = "tvm_callback_cuda_compile"


_SHIPPED: dict[str, bytes] = {}  # sha256 of CUDA source -> fatbin, for every artifact loaded


def register_cuda_binaries(folder: str, entries: list[dict]) -> None:
    """Make TVM's CUDA compile callback answer with the fatbins shipped beside a library.

    The callback stays installed for the process (TVM may compile lazily, at first launch); source
    that no loaded artifact shipped (a module compiled in this process) goes to TVM's own compiler.
    """
    for entry in entries:
        path = os.path.join(folder, entry["file"])
        if not os.path.isfile(path):
            raise ExportError(f"device code {path} is missing; it is part of the artifact (see its manifest)")
        with open(path, "rb") as f:
            _SHIPPED[entry["source_sha256"]] = f.read()
    if entries and not getattr(register_cuda_binaries, "installed", False):
        tvm_compile = tvm_ffi.get_global_func(CUDA_CALLBACK, allow_missing=True)

        def shipped_or_compiled(source: str, *args) -> bytearray:
            binary = _SHIPPED.get(hashlib.sha256(str(source).encode()).hexdigest())
            if binary is not None:
                return bytearray(binary)
            if tvm_compile is None:
                raise ExportError("CUDA kernels without shipped device code, and no CUDA compiler callback")
            return tvm_compile(source, *args)

        tvm_ffi.register_global_func(CUDA_CALLBACK, shipped_or_compiled, override=True)
        register_cuda_binaries.installed = True
