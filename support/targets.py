"""Target presets: turn what a user types (``"cpu"``, ``"cuda:sm_90"``, a JSON dict) into a TVM target.

TVM 0.27 accepts targets only in JSON-dict form. ``"cpu"`` means *this* machine: the CPU name LLVM
detects and the number of physical cores, so kernels use the real vector width and thread count.
``"cuda"`` takes the compute capability of the visible GPU, else ``sm_80`` (say ``"cuda:sm_90"``
to choose); ``"rocm"`` means ``gfx90a`` unless ``"rocm:gfx942"``. GPU targets get a generic x86-64
host, so the host code of an exported library runs on any x86-64 machine, not just this one.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple, Union

from tvm.target import Target, codegen

from support.errors import TargetError
from support.threads import physical_cores

TargetLike = Union[str, dict, Target]
PRESETS = ("cpu", "llvm", "cuda", "cuda:sm_XY", "rocm", "rocm:gfxNNN")
DEFAULT_CUDA_ARCH = "sm_80"  # A100; an H100 runs it too (sm_90 is faster there)
DEFAULT_ROCM_ARCH = "gfx90a"  # MI200
GPU_KINDS = ("cuda", "rocm")
KINDS = ("llvm",) + GPU_KINDS  # the target kinds relaxc compiles for
GPU_HOST = {"kind": "llvm"}


def host_cpu() -> str:
    """The LLVM name of the host CPU (e.g. ``icelake-server``, ``znver3``)."""
    return str(codegen.llvm_get_system_cpu())


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
        kind, _, arch = spec.partition(":")
        if kind == "cuda":
            return _from_dict({"kind": "cuda", "arch": arch or visible_cuda_arch() or DEFAULT_CUDA_ARCH})
        if kind == "rocm":
            return _from_dict({"kind": "rocm", "mcpu": arch or DEFAULT_ROCM_ARCH})
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
    if spec.get("kind") in GPU_KINDS:
        spec = {"host": GPU_HOST, **spec}
        arch = spec.get("arch") if spec["kind"] == "cuda" else spec.get("mcpu")
        pattern = r"sm_\d+[a-z]?" if spec["kind"] == "cuda" else r"gfx[0-9a-f]+"
        if arch is not None and not re.fullmatch(pattern, str(arch)):
            raise TargetError(f"{arch!r} is not a {spec['kind']} architecture (like "
                              f"{DEFAULT_CUDA_ARCH if spec['kind'] == 'cuda' else DEFAULT_ROCM_ARCH})")
    try:
        resolved = Target(spec)
    except ValueError as err:
        raise TargetError(f"invalid target {json.dumps(spec)}: {str(err).splitlines()[0]}") from None
    mcpu = spec.get("mcpu")
    if resolved.kind.name == "llvm" and mcpu and not codegen.llvm_is_valid_cpu(mcpu, spec.get("mtriple", "")):
        raise TargetError(f"LLVM does not know the CPU {mcpu!r} (this machine is {host_cpu()!r})")
    return resolved


def is_gpu(target: Target) -> bool:
    return target.kind.name in GPU_KINDS


def visible_cuda_arch() -> str | None:
    """``sm_XY`` of the first visible CUDA GPU, or None (no GPU, or no CUDA driver to ask)."""
    import tvm

    try:
        device = tvm.cuda(0)
        return "sm_" + device.compute_version.replace(".", "") if device.exist else None
    except (RuntimeError, ValueError, AttributeError):
        return None


def describe(target: Target) -> dict[str, Any]:
    """The target as a JSON-serialisable dict, for reports and manifests."""
    return json.loads(json.dumps(dict(target.export()),
                                 default=lambda o: dict(o) if hasattr(o, "items") else list(o)))


def vector_bits(target: Target) -> int:
    """Width of the target's widest vector register, from its CPU's features.

    ``codegen.llvm_get_vector_width`` answers 512 for every x86 CPU in TVM 0.27 (it reads the host),
    so the width comes from the features LLVM knows for the target's ``mcpu``.
    """
    if target.kind.name != "llvm":
        return 128
    for feature, bits in (("avx512f", 512), ("avx", 256), ("neon", 128), ("sse2", 128)):
        if has_feature(feature, target):
            return bits
    return 128


def vector_registers(target: Target) -> int:
    """How many vector registers the target's CPU has: 32 with AVX-512 or on AArch64, else 16."""
    if target.kind.name == "llvm" and any(has_feature(f, target) for f in ("avx512f", "neon")):
        return 32
    return 16


_FEATURES: dict[tuple[str, str], bool] = {}


def has_feature(feature: str, target: Target) -> bool:
    """Whether LLVM gives the ``llvm`` target's CPU ``feature``, remembered per target: each
    ``codegen.target_has_features`` asks LLVM again (0.13 ms; every schedule rule asks, about 1,500
    times in DenseNet-121's default schedules)."""
    key = (feature, str(target))
    if key not in _FEATURES:
        _FEATURES[key] = bool(codegen.target_has_features(feature, target))
    return _FEATURES[key]


class VectorUnit(NamedTuple):
    """What a CPU schedule sizes its register tiles by: fp32 lanes per vector, vector registers."""

    lanes: int
    registers: int


def accumulators(registers: int) -> int:
    """Vector registers a register tile may keep accumulators in: three quarters of them, the rest
    hold the operand vectors and broadcasts each step loads (dense and conv tiles measured in
    passes/dense.py and schedules/cpu/tiled.py; more spills)."""
    return registers * 3 // 4


def vector_unit(target: Target) -> VectorUnit:
    return VectorUnit(vector_lanes(target), vector_registers(target))


def vector_lanes(target: Target, dtype_bits: int = 32) -> int:
    """SIMD lanes of ``dtype_bits``-wide elements the target's widest vector register holds."""
    return max(1, vector_bits(target) // dtype_bits)
