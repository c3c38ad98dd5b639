"""Target presets: turn what a user types (``"cpu"``, ``"llvm"``, a JSON dict) into a TVM target.

TVM 0.27 accepts targets only in JSON-dict form. ``"cpu"`` means *this* machine: the CPU name LLVM
detects and the number of physical cores, so kernels use the real vector width and thread count.
"""

from __future__ import annotations

import json
from typing import Any, Union

from tvm.target import Target, codegen

from compiler.errors import TargetError

TargetLike = Union[str, dict, Target]
PRESETS = ("cpu", "llvm")


def host_cpu() -> str:
    """The LLVM name of the host CPU (e.g. ``icelake-server``, ``znver3``)."""
    return str(codegen.llvm_get_system_cpu())


def physical_cores() -> int:
    """Physical cores (hyper-threads share a core's vector units, so kernels do not gain from them)."""
    import psutil

    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


def resolve(target: TargetLike) -> Target:
    """Resolve a user target spec to a ``tvm.target.Target``; raises TargetError with the choices."""
    if isinstance(target, Target):
        return target
    if isinstance(target, str):
        spec = target.strip()
        if spec == "cpu":
            return Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": physical_cores()})
        if spec == "llvm":
            return Target({"kind": "llvm"})
        if spec.startswith("{"):
            try:
                return resolve(json.loads(spec))
            except json.JSONDecodeError as err:
                raise TargetError(f"target is not valid JSON: {err}") from None
        raise TargetError(f"unknown target {target!r}; use one of {', '.join(PRESETS)}, "
                          'or a JSON dict such as {"kind": "llvm", "mcpu": "znver3"}')
    if isinstance(target, dict):
        return _from_dict(target)
    raise TargetError(f"target must be a string, dict or tvm.target.Target, not {type(target).__name__}")


def _from_dict(spec: dict[str, Any]) -> Target:
    try:
        resolved = Target(spec)
    except ValueError as err:
        raise TargetError(f"invalid target {json.dumps(spec)}: {str(err).splitlines()[0]}") from None
    mcpu = spec.get("mcpu")
    if resolved.kind.name == "llvm" and mcpu and not codegen.llvm_is_valid_cpu(mcpu, spec.get("mtriple", "")):
        raise TargetError(f"LLVM does not know the CPU {mcpu!r} (this machine is {host_cpu()!r})")
    return resolved


def describe(target: Target) -> dict[str, Any]:
    """The target as a JSON-serialisable dict, for reports and manifests."""
    return json.loads(json.dumps(dict(target.export()), default=list))


def vector_bits(target: Target) -> int:
    """Width of the target's widest vector register, from its CPU's features.

    ``codegen.llvm_get_vector_width`` answers 512 for every x86 CPU in TVM 0.27 (it reads the host),
    so the width comes from the features LLVM knows for the target's ``mcpu``.
    """
    if target.kind.name != "llvm":
        return 128
    for feature, bits in (("avx512f", 512), ("avx", 256), ("neon", 128), ("sse2", 128)):
        if codegen.target_has_features(feature, target):
            return bits
    return 128


def vector_lanes(target: Target, dtype_bits: int = 32) -> int:
    """SIMD lanes of ``dtype_bits``-wide elements the target's widest vector register holds."""
    return max(1, vector_bits(target) // dtype_bits)
