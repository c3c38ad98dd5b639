"""Versions of what changes generated code, and the fingerprint of a compile (docs/design.md,
"Record store and fingerprint").

Fingerprint: same inputs, same fingerprint; any change to relaxc's major.minor version, TVM, tvm-ffi,
LLVM, the toolchain that generates GPU code, the target, the options or the module's structure
gives a new one.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata

import tvm
import tvm_ffi
from tvm.target import Target, codegen

from support.targets import describe


def versions() -> dict[str, str]:
    """Versions of everything that changes generated code."""
    return {
        "relaxc": metadata.version("relaxc") if _installed("relaxc") else "dev",
        "tvm": tvm.__version__,
        "tvm_ffi": metadata.version("apache-tvm-ffi"),
        "llvm": str(codegen.llvm_version_major()),
    }


def code_versions() -> dict[str, str]:
    """The versions that decide whether tuning records still apply (relaxc's own does not)."""
    return {k: v for k, v in versions().items() if k != "relaxc"}


def _installed(dist: str) -> bool:
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def fingerprint(module: tvm.IRModule, target: Target, options: dict | None = None,
                tools: dict | None = None) -> str:
    """sha256 over relaxc major.minor, TVM/ffi/LLVM versions, the GPU ``tools`` (nvcc; ROCm device
    libraries and lld), target, options and module structure."""
    info = {**versions(), **(tools or {})}
    info["relaxc"] = ".".join(info["relaxc"].split(".")[:2])
    payload = {
        "versions": info,
        "target": describe(target),
        "options": options or {},
        "module": tvm_ffi.structural_hash(module),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
