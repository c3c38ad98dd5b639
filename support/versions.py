"""Versions of what changes generated code, and the fingerprint of a compile (docs/design.md,
"The cache and fingerprint").

Fingerprint: same inputs, same fingerprint; any change to relaxc's major.minor version, TVM, tvm-ffi,
LLVM, the toolchain that generates GPU code, the target, the options, the module's structure or
the weights gives a new one.
"""

from __future__ import annotations

import functools
import hashlib
import json
from importlib import metadata

import tvm
import tvm_ffi
from tvm.target import Target, codegen

from relaxc.support.targets import describe


def versions() -> dict[str, str]:
    """Versions of everything that changes generated code."""
    return {
        "relaxc": _distribution("relaxc") or "dev",
        "tvm": tvm.__version__,
        "tvm_ffi": _distribution("apache-tvm-ffi"),
        "llvm": str(codegen.llvm_version_major()),
    }


def code_versions() -> dict[str, str]:
    """The versions that decide whether tuning records still apply (relaxc's own does not)."""
    return {k: v for k, v in versions().items() if k != "relaxc"}


@functools.cache
def _distribution(dist: str) -> str | None:
    """An installed distribution's version, None where it is not installed; read once a process
    (parsing its metadata took 35 ms of every 190 ms compile of a one-operator model)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def fingerprint(module: tvm.IRModule, target: Target, options: dict | None = None,
                tools: dict | None = None, weights: tvm.IRModule | None = None) -> str:
    """sha256 over relaxc major.minor, TVM/ffi/LLVM versions, the GPU ``tools`` (nvcc; ROCm device
    libraries and lld), target, options, ``module``'s structure and the values of the constants in
    ``weights`` (default: ``module``'s own).

    Pass the imported module as ``weights``: every later constant is computed from its constants by
    passes the other inputs pin, and hashing the computed ones costs time for nothing (0.54 ms per
    MB: 0.43 s of a VGG-19 compile with Winograd weights, four times the size of the 3x3 ones)."""
    info = {**versions(), **(tools or {})}
    info["relaxc"] = ".".join(info["relaxc"].split(".")[:2])
    payload = {
        "versions": info,
        "target": describe(target),
        "options": options or {},
        "module": tvm_ffi.structural_hash(module, skip_tensor_content=True),
        "weights": tvm_ffi.structural_hash(module if weights is None else weights),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
