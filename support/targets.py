"""Target presets: turn what a user types (``"cpu"``, ``"cuda:sm_90"``, a JSON dict) into a TVM target.

TVM 0.27 accepts targets only in JSON-dict form. ``"cpu"`` means *this* machine: the CPU name LLVM
detects and the number of physical cores, so kernels use the real vector width and thread count.
``"cuda"`` takes the compute capability of the visible GPU, else ``sm_80`` (say ``"cuda:sm_90"``
to choose); ``"rocm"`` means ``gfx90a`` unless ``"rocm:gfx942"``. GPU targets get a generic x86-64
host, so the host code of an exported library runs on any x86-64 machine, not just this one.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, NamedTuple, Union

from tvm.target import Target, codegen

from relaxc.support.errors import TargetError, message
from relaxc.support.threads import physical_cores

TargetLike = Union[str, dict, Target]
PRESETS = ("cpu", "llvm", "cuda", "cuda:sm_XY", "rocm", "rocm:gfxNNN")
DEFAULT_CUDA_ARCH = "sm_80"  # A100; an H100 runs it too (sm_90 is faster there)
DEFAULT_ROCM_ARCH = "gfx90a"  # MI200
GPU_KINDS = ("cuda", "rocm")
KINDS = ("llvm",) + GPU_KINDS  # the target kinds relaxc compiles for
GPU_HOST = {"kind": "llvm"}


# x86 instruction-set features that decide which code a CPU runs, by LLVM's name -> /proc/cpuinfo's flag
ISA_FLAGS = {"avx": "avx", "avx2": "avx2", "fma": "fma", "f16c": "f16c", "avx512f": "avx512f", "avx512cd": "avx512cd",
             "avx512bw": "avx512bw", "avx512dq": "avx512dq", "avx512vl": "avx512vl", "avx512vnni": "avx512_vnni",
             "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16", "avx512vbmi": "avx512vbmi",
             "avx512ifma": "avx512ifma", "avxvnni": "avx_vnni", "avxifma": "avx_ifma", "amx-tile": "amx_tile",
             "amx-int8": "amx_int8", "amx-bf16": "amx_bf16", "amx-fp16": "amx_fp16"}
# CPUs a host may be named after when LLVM's name misses features the host has (a VM with a masked
# model number): the one with the most of the host's features wins, ties in this order
X86_CPUS = ("graniterapids", "emeraldrapids", "sapphirerapids", "icelake-server", "cascadelake",
            "skylake-avx512", "znver5", "znver4", "znver3", "alderlake", "haswell")


def host_cpu() -> str:
    """The LLVM name of the host CPU (e.g. ``icelake-server``, ``znver3``), by its features too
    (``named_cpu``)."""
    return named_cpu(str(codegen.llvm_get_system_cpu()), host_isa())


def named_cpu(llvm_name: str | None, features: frozenset[str] | None) -> str:
    """The name of a CPU that LLVM calls ``llvm_name`` (None: unknown) and that has ``features``.

    LLVM names a CPU from its model number; a VM may mask it (a Sapphire Rapids class VM with AMX
    and AVX-512 FP16 that LLVM calls ``rocketlake``). Where the features (``/proc/cpuinfo``) differ
    from those of LLVM's name, the CPU is named after the known CPU with the most of its features
    and none it lacks."""
    if features is None or (llvm_name is not None and isa("llvm", llvm_name) == features):
        return llvm_name or "x86-64"
    fitting = [cpu for cpu in ((llvm_name,) if llvm_name else ()) + X86_CPUS if isa("llvm", cpu) <= features]
    return max(fitting, key=lambda cpu: len(isa("llvm", cpu)), default=llvm_name or "x86-64")


def host_isa() -> frozenset[str] | None:
    """The host's x86 instruction-set features (``ISA_FLAGS``, by LLVM's names) from
    ``/proc/cpuinfo``; None where there is no such file or it lists no flags (not Linux, not x86)."""
    try:
        with open("/proc/cpuinfo") as f:
            return cpuinfo_isa(f.read())
    except OSError:
        return None


def cpuinfo_isa(cpuinfo: str) -> frozenset[str] | None:
    """The ``ISA_FLAGS`` features a ``/proc/cpuinfo`` text lists; None where it lists no flags."""
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), None)
    return None if flags is None else frozenset(f for f, flag in ISA_FLAGS.items() if flag in flags)


def cpuinfo_cores(cpuinfo: str) -> int:
    """Physical cores by a ``/proc/cpuinfo`` text: distinct (physical id, core id) pairs, else processors."""
    pairs, processors, package = set(), 0, "0"
    for line in cpuinfo.splitlines():
        name, _, value = (part.strip() for part in line.partition(":"))
        if name == "processor":
            processors += 1
        elif name == "physical id":
            package = value
        elif name == "core id":
            pairs.add((package, value))
    return len(pairs) or processors or 1


@functools.lru_cache(maxsize=None)
def isa(kind: str, mcpu: str) -> frozenset[str]:
    """The ``ISA_FLAGS`` features LLVM gives the CPU ``mcpu`` (``kind`` is the target kind; none but llvm)."""
    if kind != "llvm" or not codegen.llvm_is_valid_cpu(mcpu, ""):
        return frozenset()
    return frozenset(codegen.llvm_get_cpu_features(Target({"kind": "llvm", "mcpu": mcpu}))) & frozenset(ISA_FLAGS)


def runs_on_host(target: Target) -> bool:
    """Whether code compiled for ``target`` runs on this machine: an ``llvm`` target whose CPU's
    instruction-set features the host has (by ``/proc/cpuinfo``; by LLVM's host name where there is none)."""
    if target.kind.name != "llvm":
        return False
    mcpu = str(target.attrs.get("mcpu", "")) or "x86-64"
    host = host_isa()
    return isa("llvm", mcpu) <= (host if host is not None else isa("llvm", host_cpu()))


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
        raise TargetError(f"invalid target {json.dumps(spec)}: {message(err)}") from None
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


class ByteDot(NamedTuple):
    """How a CPU sums uint8 x int8 products into int32 lanes: one ``instruction`` (an LLVM
    intrinsic) adds to each of ``lanes`` accumulators the products of ``depth`` consecutive elements
    of the data, broadcast, and of that lane's weights, the data read as ``data`` and the weights
    stored as ``weights``."""

    lanes: int
    depth: int
    data: str
    weights: str
    instruction: str
    pairs: str | None = None  # where ``instruction`` leaves int16 pair sums: the intrinsic adding pairs of them

    @property
    def products_per_multiply(self) -> float:
        """Products a lane sums per multiplying instruction (``pairs`` is a second one)."""
        return self.depth / (2 if self.pairs else 1)


# Widest first. VNNI's vpdpbusd sums 4 products exactly (4x an fp32 FMA's multiply-adds). Without
# it, vpmaddubsw sums pairs of products into int16, saturating (255 x 127 x 2 > 32767), and pmaddwd
# with ones sums the pairs into int32: onnxruntime's kernels there (MLAS) do the same with the same
# pairs, so the results are its results (exact int16 pmaddwd on widened data differed from it on
# 23-98 % of the outputs of ResNet-18, MobileNetV2, EfficientNet-B0 and BERT on Zen 3).
BYTE_DOTS = (("avx512vnni", ByteDot(16, 4, "uint8", "int8", "llvm.x86.avx512.vpdpbusd.512")),
             ("avxvnni", ByteDot(8, 4, "uint8", "int8", "llvm.x86.avx512.vpdpbusd.256")),
             ("avx512bw", ByteDot(16, 4, "uint8", "int8", "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512")),
             ("avx2", ByteDot(8, 4, "uint8", "int8", "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd")))


HALVES = {"llvm.x86.avx512.vpdpbusd.512": "llvm.x86.avx512.vpdpbusd.256",  # AVX-512VL's EVEX form
          "llvm.x86.avx512.pmaddw.d.512": "llvm.x86.avx2.pmadd.wd",
          "llvm.x86.avx512.pmaddubs.w.512": "llvm.x86.avx2.pmadd.ub.sw"}


def fitting(dot: ByteDot, lanes: int) -> ByteDot | None:
    """``dot``, or its 256-bit form, whose lanes divide ``lanes`` (an 8-channel block on an AVX-512
    CPU, which the measured layout choice can pick); None if neither does."""
    if lanes % dot.lanes == 0:
        return dot
    if dot.instruction in HALVES and lanes % (dot.lanes // 2) == 0:
        return dot._replace(lanes=dot.lanes // 2, instruction=HALVES[dot.instruction],
                            pairs=dot.pairs and HALVES[dot.pairs])
    return None


def byte_dot(target: Target) -> ByteDot | None:
    """The target's widest exact uint8 x int8 dot product instruction; None off x86."""
    if target.kind.name != "llvm":
        return None
    return next((dot for feature, dot in BYTE_DOTS if has_feature(feature, target)), None)


class VectorUnit(NamedTuple):
    """What a CPU schedule sizes its register tiles by: fp32 lanes per vector, vector registers,
    and how it sums bytes (None where it has no byte dot product)."""

    lanes: int
    registers: int
    bytes: ByteDot | None = None


def accumulators(registers: int) -> int:
    """Vector registers a register tile may keep accumulators in: three quarters of them, the rest
    hold the operand vectors and broadcasts each step loads (dense and conv tiles measured in
    passes/dense.py and schedules/cpu/tiled.py; more spills)."""
    return registers * 3 // 4


def vector_unit(target: Target) -> VectorUnit:
    return VectorUnit(vector_lanes(target), vector_registers(target), byte_dot(target))


def vector_lanes(target: Target, dtype_bits: int = 32) -> int:
    """SIMD lanes of ``dtype_bits``-wide elements the target's widest vector register holds."""
    return max(1, vector_bits(target) // dtype_bits)


def dynamic_multiple(target: Target) -> int:
    """What a dynamic extent that a kernel tiles along is padded to a multiple of: two vectors of
    fp32 lanes, so a register tile two vectors wide divides it (a dynamic BERT's attention scores,
    AVX-512: 0.128 ms a layer against 0.137 with one vector; the model 1-3 % faster at batch 1 and
    4, sequence 128 and 384, 2 % slower at sequence 16)."""
    return 2 * vector_lanes(target)
