"""CUDA kernels compiled at export into fatbins beside the library, which loading hands TVM
(``runtime/device_code.py``): loading never compiles."""

from __future__ import annotations

import hashlib
import os

import tvm

from relaxc.build.codegen import toolchain
from relaxc.support.files import Staging


def cuda_sources(module: tvm.runtime.Module) -> list[str]:
    """The CUDA C of every CUDA module in ``module``'s import tree."""
    sources, stack, seen = [], [module], []
    while stack:
        mod = stack.pop()
        if any(mod.same_as(s) for s in seen):
            continue
        seen.append(mod)
        if mod.kind == "cuda":
            sources.append(str(mod.inspect_source("cuda")))
        stack.extend(mod.imports)
    return sources


def write_cuda_fatbins(module: tvm.runtime.Module, arch: str, library_path: str, staging: Staging) -> list[dict]:
    """Compile each CUDA module for ``arch`` and write ``<library>.<i>.fatbin`` as part of
    ``staging``; returns the manifest entries."""
    entries = []
    for index, source in enumerate(cuda_sources(module)):
        binary = toolchain.compile_cuda(source, arch)
        final = f"{os.path.splitext(library_path)[0]}.{index}.fatbin"
        with open(staging.path(final), "wb") as f:
            f.write(binary)
        entries.append({"file": os.path.basename(final), "arch": arch, "format": "fatbin",
                        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
                        "sha256": hashlib.sha256(binary).hexdigest()})
    return entries
