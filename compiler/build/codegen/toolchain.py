"""The external tools GPU code generation needs, found once and named in errors when missing.

CUDA: TVM 0.27 keeps CUDA kernels as CUDA C in the library and compiles them when the library is
loaded (its NVPTX path fails on LLVM 22's barrier intrinsics). relaxc compiles that source with
``nvcc`` at export instead, so the artifact carries real device code (a fatbin) and the machine
that runs it needs no compiler. The toolkit root comes from ``nvcc`` itself, since a wrapper on
PATH (``/usr/local/bin/nvcc`` here) hides it from TVM's own search.

ROCm: TVM's LLVM emits an AMDGPU object (code object v6) and links it into a loadable code object
with ``ld.lld``; the linker must know v6, which Debian's lld 14/15 do not ("unknown abi version").
relaxc links with the first ``ld.lld`` at least as new as TVM's LLVM, including the one in the
``ziglang`` package from PyPI. The ROCm device libraries (ocml, ockl bitcode) come from Debian's
``rocm-device-libs`` or a ROCm install.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile

import tvm_ffi

from relaxc.support.errors import TargetError

ROCM_BITCODE_DIRS = ("/opt/rocm/amdgcn/bitcode", "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode")


@tvm_ffi.register_error
class ToolchainError(TargetError):
    """A tool that code generation for the target needs is missing or too old."""


def _run(args: list[str]) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=False, timeout=60).stdout


# --- CUDA -----------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def cuda_home() -> str:
    """Root of the CUDA toolkit that ``nvcc`` belongs to; also exported as CUDA_PATH for TVM."""
    if os.environ.get("CUDA_PATH"):
        return os.environ["CUDA_PATH"]
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise ToolchainError("CUDA code generation needs nvcc on PATH (the CUDA toolkit); none found")
    dryrun = subprocess.run([nvcc, "-dryrun", "-c", "-x", "cu", os.devnull], capture_output=True,
                            text=True, check=False, timeout=60).stderr
    match = re.search(r"^#\$ TOP=(.*)$", dryrun, re.MULTILINE)
    home = os.path.realpath(match.group(1)) if match else os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    os.environ["CUDA_PATH"] = home
    return home


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str:
    """``nvcc``'s release, e.g. ``13.0.88``."""
    match = re.search(r"V(\d+\.\d+\.\d+)", _run([os.path.join(cuda_home(), "bin", "nvcc"), "--version"]))
    return match.group(1) if match else "unknown"


def compile_cuda(source: str, arch: str) -> bytes:
    """Compile TVM's CUDA C for ``arch`` (``sm_80``) into a fatbin: SASS for ``arch`` and its PTX,
    which the driver JIT-compiles for newer GPUs."""
    nvcc = os.path.join(cuda_home(), "bin", "nvcc")
    with tempfile.TemporaryDirectory(prefix="relaxc-cuda-") as work:
        cu, fatbin = os.path.join(work, "kernels.cu"), os.path.join(work, "kernels.fatbin")
        with open(cu, "w") as f:
            f.write(source)
        proc = subprocess.run([nvcc, "--fatbin", "-O3", "-w", f"-arch={arch}", "-o", fatbin, cu],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ToolchainError(f"nvcc could not compile the CUDA kernels for {arch}:\n{proc.stderr[-3000:]}")
        with open(fatbin, "rb") as f:
            return f.read()


# --- ROCm -----------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def rocm_bitcode_dir() -> str:
    """Directory of the ROCm device-library bitcode (ocml, ockl, oclc_*)."""
    candidates = ([os.path.join(os.environ["ROCM_PATH"], "amdgcn", "bitcode")] if os.environ.get("ROCM_PATH")
                  else []) + list(ROCM_BITCODE_DIRS)
    for directory in candidates:
        if os.path.exists(os.path.join(directory, "ocml.bc")):
            return directory
    raise ToolchainError("ROCm code generation needs the ROCm device libraries (ocml.bc and friends): "
                         f"none in {', '.join(candidates)}; install Debian's rocm-device-libs or ROCm")


@functools.lru_cache(maxsize=None)
def rocm_device_libs_version() -> str:
    """Version of the device libraries (Debian package version, or the ROCm release)."""
    if shutil.which("dpkg-query"):
        version = _run(["dpkg-query", "-W", "-f", "${Version}", "rocm-device-libs"]).strip()
        if version:
            return version
    info = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(rocm_bitcode_dir()))), ".info", "version")
    return open(info).read().strip() if os.path.exists(info) else "unknown"


@functools.lru_cache(maxsize=None)
def lld() -> tuple[list[str], str]:
    """The command of an ``ld.lld`` that links TVM's AMDGPU objects, and its version."""
    from tvm.target import codegen

    needed = codegen.llvm_version_major()
    candidates = [[path] for name in [f"ld.lld-{v}" for v in range(needed + 4, needed - 1, -1)] + ["ld.lld"]
                  if (path := shutil.which(name))]
    candidates.append([sys.executable, "-m", "ziglang", "ld.lld"])
    seen = []
    for command in candidates:
        try:
            match = re.search(r"LLD (\d+)\.(\d+)\.(\d+)", _run(command + ["--version"]))
        except (OSError, subprocess.TimeoutExpired):
            continue
        if match:
            seen.append(f"{' '.join(command)}: {match.group(0)}")
            if int(match.group(1)) >= needed:
                return command, match.group(0).split()[1]
    raise ToolchainError(f"ROCm code generation needs ld.lld >= {needed} (TVM's LLVM emits AMDGPU code "
                         f"object v6; older lld says 'unknown abi version'); found: {seen or 'none'}. "
                         "pip install ziglang provides one")


def rocm_link(object_code: bytes) -> bytes:
    """Link an AMDGPU relocatable object into a loadable code object (hsaco)."""
    command, _ = lld()
    with tempfile.TemporaryDirectory(prefix="relaxc-rocm-") as work:
        obj, hsaco = os.path.join(work, "kernels.o"), os.path.join(work, "kernels.hsaco")
        with open(obj, "wb") as f:
            f.write(object_code)
        proc = subprocess.run(command + ["--no-undefined", "-shared", obj, "-o", hsaco],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ToolchainError(f"linking the AMDGPU code object failed: {proc.stdout}{proc.stderr}")
        with open(hsaco, "rb") as f:
            return f.read()  # TVM wants the bytes


def prepare(kind: str) -> dict[str, str]:
    """Check the tools of a target kind, point TVM at them, and return their versions (fingerprinted)."""
    if kind == "cuda":
        cuda_home()
        return {"nvcc": nvcc_version()}
    if kind == "rocm":
        os.environ.setdefault("ROCM_PATH", os.path.dirname(os.path.dirname(rocm_bitcode_dir())))
        _, version = lld()
        tvm_ffi.register_global_func("tvm_callback_rocm_link", lambda obj: bytearray(rocm_link(bytes(obj))), override=True)
        return {"rocm_device_libs": rocm_device_libs_version(), "lld": version}
    return {}
