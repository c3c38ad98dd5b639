"""relaxc's parallel launcher (``launcher.c``): compiled into each exported CPU library, put in the
place of TVM's thread pool when the library is loaded, so loading needs no compiler.

Why: TVM's pool gives each thread an even share of a parallel loop and waits for every thread, so
one busy core delays each kernel by a whole share. The launcher cuts a loop into
``TASKS_PER_THREAD`` tasks per thread that the threads claim from a counter, and waits only for
tasks already claimed (measured: docs/concurrency.md, "A busy core").

The loader points the library's ``__TVMBackendParallelLaunch`` (the pointer its kernels call
through, which TVM fills in at load) at the launcher, and keeps TVM's pool where the launcher
cannot stand in: a library whose kernels synchronise their tasks (TVM's parallel barrier), or one
exported before the launcher existed.
"""

from __future__ import annotations

import collections
import ctypes
import os
import subprocess
import threading

import _ctypes
import tvm_ffi.libinfo

from relaxc.support.errors import ExportError

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.c")
TASKS_PER_THREAD = 4  # the share a late thread leaves to others; more tasks cost more loop set-ups
LAUNCHERS = ("relaxc", "tvm")

_LAUNCH, _BARRIER = "__TVMBackendParallelLaunch", "__TVMBackendParallelBarrier"
_ENTRY, _STOP = "relaxc_parallel_launch", "relaxc_launcher_stop"
_OPEN: dict[str, ctypes.CDLL] = {}  # relaxc's handle of each library while a load of it lives
_LOADS: collections.Counter = collections.Counter()
_LOCK = threading.Lock()


def compile_object(folder: str) -> str:
    """``launcher.c`` compiled (position-independent, -O2, for any x86-64) into ``folder``."""
    out = os.path.join(folder, "relaxc_launcher.o")
    compiler = os.environ.get("CC", "cc")
    try:
        proc = subprocess.run([compiler, "-O2", "-fPIC", "-c", SOURCE, "-o", out], capture_output=True,
                              text=True, timeout=120, check=False)
    except OSError as err:
        raise ExportError(f"export links the library with a C compiler; {compiler!r} cannot run: {err}") from None
    if proc.returncode != 0:
        raise ExportError(f"{compiler} could not compile relaxc's parallel launcher ({SOURCE}):\n"
                          f"{proc.stderr.strip()[-2000:]}")
    return out


def install(library: str, threads: int, launcher: str = "relaxc") -> str:
    """Make ``library``'s kernels launch their parallel loops through ``launcher``; returns the
    launcher that runs them ("relaxc" or "tvm") and, for TVM's where relaxc's was asked for, why."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; choose one of {', '.join(LAUNCHERS)}")
    with _LOCK:
        if library not in _OPEN:
            _OPEN[library] = ctypes.CDLL(library)  # the handle TVM opened: same path, same library
        lib = _OPEN[library]
        _LOADS[library] += 1
        if not hasattr(lib, _LAUNCH):
            return "tvm (no parallel loop)"
        if launcher == "tvm":
            return "tvm"
        if hasattr(lib, _BARRIER):
            return "tvm (a kernel synchronises its tasks)"
        if not hasattr(lib, _ENTRY):
            return "tvm (exported without relaxc's launcher)"
        ffi = ctypes.CDLL(tvm_ffi.libinfo.find_libtvm_ffi())
        status = lib.relaxc_launcher_start(ctypes.c_int(threads), ctypes.c_int(TASKS_PER_THREAD),
                                           *(ctypes.cast(getattr(ffi, name), ctypes.c_void_p) for name in
                                             ("TVMFFIErrorMoveFromRaised", "TVMFFIErrorSetRaised",
                                              "TVMFFIObjectDecRef")))
        ctypes.c_void_p.in_dll(lib, _LAUNCH).value = ctypes.cast(lib.relaxc_parallel_launch, ctypes.c_void_p).value
        return "relaxc" if status == 0 else f"relaxc (not all its threads started: {os.strerror(status)})"


def release(library: str) -> None:
    """One load of ``library`` is gone (``install`` counted it). After the last, the launcher's
    threads stop and relaxc closes its handle: no thread runs the library's code while no load uses
    it (TVM itself keeps every library it loaded mapped: ``runtime._mapped_from``)."""
    with _LOCK:
        _LOADS[library] -= 1
        if _LOADS[library] > 0:
            return
        del _LOADS[library]
        lib = _OPEN.pop(library)
        if hasattr(lib, _STOP):  # a library with relaxc's launcher
            lib.relaxc_launcher_stop()
        _ctypes.dlclose(lib._handle)
