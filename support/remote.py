"""Devices behind a TVM RPC tracker, where kernels are timed when tuning for a machine one does not
compile on (docs/rpc.md).

A ``Tracker`` names the tracker and the key its devices registered under. ``probe`` asks every
server under the key what it is, through a small C probe uploaded to each (``rpc_probe.c``: a
server needs only TVM's runtime, no relaxc): its CPU (LLVM's name where the server has TVM's
compiler library, else the known CPU its features fit), physical cores, and the TVM and tvm-ffi
versions beside the libraries it loaded. Every server must be the same CPU class with the same
cores and relaxc's versions, else nothing is measured: a mixed fleet would put one machine's times
into another's store.

``measuring_on(tracker)`` makes the kernels relaxc times itself (schedule selection, convolution
dispatch, layout costs) run on a device of the tracker: ``on_bench`` gives each measurement a device
and a way to load what it built there, local or remote.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import os
import re
import socket
import subprocess
import tempfile
from typing import Callable, Iterator, TypeVar

import numpy as np
import tvm
import tvm_ffi.libinfo
from tvm import rpc

from relaxc.support import targets
from relaxc.support.errors import RemoteError

log = logging.getLogger("relaxc")
T = TypeVar("T")
PROBE_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rpc_probe.c")
PROBE_FILES = ("relaxc_cpuinfo.txt", "relaxc_maps.txt", "relaxc_environ.txt")  # the probe's, in the session's folder
CONNECT_TIMEOUT_S = 10  # a tracker that does not answer by then is not there
SESSION_TIMEOUT_S = 600  # a session (one kernel's selection, one dispatch measurement) ends by then
ATTEMPTS = 3  # servers a measurement is tried on before a failing fleet is an error
EVICT_BYTES = 64 << 20  # more than any L3 of the machines seen
CHECKED = ("tvm", "tvm_ffi")  # versions a device must share with this machine (the records' fingerprint)
# what the error of a measurement whose RPC server failed it says (RPCCode: the session ended mid-call)
SERVER_FAILURES = ("RPCCode::", "RPCError", "RPCSessionTimeoutError", "ConnectionResetError", "ConnectionRefusedError",
                   "BrokenPipeError", "ConnectionError", "Cannot connect", "TimeoutError", "timed out")
# the libraries whose folders hold the versions: library file -> the _version.py two folders up
VERSION_FILES = {"libtvm_runtime.so": "tvm", "libtvm_ffi.so": "tvm_ffi"}


@dataclasses.dataclass(frozen=True)
class Tracker:
    """A TVM RPC tracker and the key its devices registered under."""

    host: str
    port: int
    key: str

    @classmethod
    def parse(cls, address: str, key: str | None) -> "Tracker":
        """``"host:port"`` and a key, checked; a RemoteError saying what is missing."""
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise RemoteError(f"rpc must be HOST:PORT of a TVM RPC tracker, not {address!r}")
        if not key:
            raise RemoteError("rpc needs rpc_key (--rpc-key): the key the devices registered under "
                              "(python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY)")
        return cls(host, int(port), key)

    def __str__(self) -> str:
        return f"{self.host}:{self.port} key {self.key!r}"

    def connect(self) -> rpc.TrackerSession:
        try:  # TVM's own connect retries for a minute before it says the tracker is not there
            socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT_S).close()
            return rpc.connect_tracker(self.host, self.port)
        except (OSError, RuntimeError) as err:
            raise RemoteError(f"cannot reach the RPC tracker at {self.host}:{self.port} ({err}); start it with "
                              "python -m tvm.exec.rpc_tracker --host HOST --port PORT") from None

    def servers(self) -> int:
        """How many servers are registered under the key now (busy or free)."""
        info = self.connect().summary()
        return sum(1 for server in info.get("server_info", []) if server.get("key") == f"server:{self.key}")

    def session(self, timeout_s: float = SESSION_TIMEOUT_S) -> rpc.RPCSession:
        """A session on the next free server under the key (waits for one)."""
        return self.connect().request(self.key, priority=1, session_timeout=timeout_s)


@dataclasses.dataclass(frozen=True)
class Device:
    """What one server under a key is."""

    cpu: str  # LLVM's name, by its features too (targets.named_cpu)
    cores: int
    isa: frozenset[str] | None
    versions: dict[str, str]
    threads: int  # the server's thread pool (TVM_NUM_THREADS, else TVM's default)
    bound: bool  # whether it pins its threads to cores (TVM_BIND_THREADS, on unless 0)

    def target(self) -> tvm.target.Target:
        return tvm.target.Target({"kind": "llvm", "mcpu": self.cpu, "num-cores": self.cores})


def probe(tracker: Tracker) -> Device:
    """Probe every server registered under the tracker's key (holding one session per server, so each
    answers once); a RemoteError where there is none, one differs from the others, or its TVM or
    tvm-ffi version is not this machine's."""
    count = tracker.servers()
    if count == 0:
        raise RemoteError(f"no RPC server is registered under key {tracker.key!r} at {tracker.host}:{tracker.port}; "
                          f"start one on each device: python -m tvm.exec.rpc_server --tracker "
                          f"{tracker.host}:{tracker.port} --key {tracker.key}")
    with tempfile.TemporaryDirectory(prefix="relaxc-probe-") as folder:
        library = _compile_probe(folder)
        sessions = [tracker.session(60) for _ in range(count)]  # all held at once: one per server
        devices = [_probe_one(session, library) for session in sessions]
        del sessions  # closes them
    return one_kind(devices, tracker)


def one_kind(devices: list[Device], tracker: Tracker) -> Device:
    """The device that every one of ``devices`` (the servers under the tracker's key) is; a
    RemoteError where one has other TVM or tvm-ffi versions than this machine, runs other threads
    than relaxc would (one per core, unpinned: ``support/threads.py``), or they differ."""
    from relaxc.support.versions import code_versions

    local = code_versions()
    for device in devices:
        wrong = [k for k in CHECKED if device.versions.get(k) != local[k]]
        if wrong:
            theirs = ", ".join(f"{k} {device.versions.get(k) or 'of a version it does not say'}" for k in wrong)
            raise RemoteError(f"an RPC server under key {tracker.key!r} runs {theirs}, this machine "
                              f"{', '.join(f'{k} {local[k]}' for k in wrong)}: records would not replay; "
                              f"install apache-tvm=={local['tvm']} apache-tvm-ffi=={local['tvm_ffi']} there")
        if device.threads != device.cores or device.bound:
            raise RemoteError(f"an RPC server under key {tracker.key!r} runs {device.threads} threads"
                              f"{', pinned to cores,' if device.bound else ''} on {device.cores} cores; relaxc runs "
                              f"one unpinned thread per core and times kernels so: start each server with "
                              f"TVM_NUM_THREADS={device.cores} TVM_BIND_THREADS=0 python -m tvm.exec.rpc_server ...")
    kinds = sorted({(d.cpu, d.cores) for d in devices})
    if len(kinds) > 1:
        raise RemoteError(f"the {len(devices)} RPC servers under key {tracker.key!r} are not one kind of machine "
                          f"({', '.join(f'{cpu} with {cores} cores' for cpu, cores in kinds)}): their times would "
                          "mix in one record store; register each kind under a key of its own")
    return devices[0]


def _compile_probe(folder: str) -> str:
    out = os.path.join(folder, "relaxc_probe.so")
    compiler = os.environ.get("CC", "cc")
    command = [compiler, "-O2", "-fPIC", "-shared", "-I", tvm_ffi.libinfo.find_include_path(), PROBE_SOURCE, "-o", out]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    except OSError as err:
        raise RemoteError(f"probing an RPC device compiles a small C library; {compiler!r} cannot run: {err}") from None
    if proc.returncode != 0:
        raise RemoteError(f"{compiler} could not compile relaxc's RPC probe ({PROBE_SOURCE}):\n{proc.stderr[-2000:]}")
    return out


def _probe_one(session: rpc.RPCSession, library: str) -> Device:
    with open(library, "rb") as f:
        session.upload(bytearray(f.read()), "relaxc_probe.so")
    if not session.load_module("relaxc_probe.so")["relaxc_probe"]():
        raise RemoteError("relaxc's probe could not read /proc/cpuinfo and /proc/self on an RPC server "
                          "(relaxc measures on Linux devices only)")
    cpuinfo, maps, environ = (bytes(session.download(name)).decode(errors="replace") for name in PROBE_FILES)
    variables = dict(item.partition("=")[::2] for item in environ.split("\0") if "=" in item)
    versions = {}
    for path in {line.split()[-1] for line in maps.splitlines() if line.split()}:
        name = VERSION_FILES.get(os.path.basename(path))
        if name and name not in versions:
            versions[name] = _version_beside(session, os.path.dirname(os.path.dirname(path)))
    try:
        llvm_name = str(session.get_function("target.llvm_get_system_cpu")())
    except Exception:  # noqa: BLE001 - a server with TVM's runtime only: named by its features
        llvm_name = None
    features = targets.cpuinfo_isa(cpuinfo)
    return Device(targets.named_cpu(llvm_name, features), targets.cpuinfo_cores(cpuinfo), features, versions,
                  int(session.get_function("runtime.NumThreads")()), variables.get("TVM_BIND_THREADS", "1") != "0")


def _version_beside(session: rpc.RPCSession, package: str) -> str | None:
    """The version in ``<package>/_version.py`` on the server (as pip installs TVM and tvm-ffi)."""
    try:
        text = bytes(session.download(os.path.join(package, "_version.py"))).decode(errors="replace")
    except Exception:  # noqa: BLE001 - a runtime built from source has no such file
        return None
    found = re.search(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text, re.M)
    return found.group(1) if found else None


def server_failed(error: BaseException | str) -> bool:
    """Whether an error (or a trial's error message) is its RPC server's (gone, unreachable, out of
    time), not the kernel's."""
    if isinstance(error, (OSError, tvm.error.RPCError, tvm.error.RPCSessionTimeoutError)):
        return True
    return any(marker in str(error) for marker in SERVER_FAILURES)


_MEASURING_ON: contextvars.ContextVar[Tracker | None] = contextvars.ContextVar("relaxc_measuring_on", default=None)


@contextlib.contextmanager
def measuring_on(tracker: Tracker | None) -> Iterator[None]:
    """Within: ``on_bench`` and tuning measure on the devices of ``tracker`` (None: on this machine)."""
    token = _MEASURING_ON.set(tracker)
    try:
        yield
    finally:
        _MEASURING_ON.reset(token)


def measuring_tracker() -> Tracker | None:
    return _MEASURING_ON.get()


@dataclasses.dataclass
class Bench:
    """Where one measurement runs: its device, and ``load`` to put a built library or VM executable there."""

    device: tvm.runtime.Device
    session: rpc.RPCSession | None = None
    folder: str | None = None
    loaded: int = 0
    _sweep: object = None  # what evict_caches writes over: a numpy array here, a tensor on a server

    def evict_caches(self) -> None:
        """Write ``EVICT_BYTES`` where the device runs, so the next run reads its data from memory: a
        numpy array here, a tensor on a server with a small kernel of TVM's (its own RNG fill writes
        3.5x slower than numpy)."""
        if self.session is None:
            if self._sweep is None:
                self._sweep = np.zeros(EVICT_BYTES // 4, dtype=np.float32)
            self._sweep += 1.0
            return
        if self._sweep is None:
            kernel = self.load(tvm.compile(_sweep(), target=tvm.target.Target({"kind": "llvm"})))
            self._sweep = (kernel["main"], tvm.runtime.empty((EVICT_BYTES // 4,), "float32", self.device))
        sweep, tensor = self._sweep
        sweep(tensor, tensor)  # in place: read and written, each element once

    def load(self, built: tvm.runtime.Executable) -> tvm.runtime.Executable | tvm.runtime.Module:
        """``built`` (``tvm.compile``'s result) where the bench's device runs it: a kernel library's
        module, or what ``relax.VirtualMachine`` takes for a VM executable."""
        if self.session is None:
            return built if isinstance(built, tvm.relax.VMExecutable) else built.mod
        self.loaded += 1
        name = f"relaxc_measured_{self.loaded}.so"
        path = os.path.join(self.folder, name)
        built.export_library(path)
        with open(path, "rb") as f:
            self.session.upload(bytearray(f.read()), name)
        return self.session.load_module(name)


def _sweep() -> tvm.IRModule:
    """A kernel adding 1 to each of ``EVICT_BYTES`` of floats, in parallel (generic x86-64: any device runs it)."""
    rows, width = EVICT_BYTES // 4 // 4096, 4096
    data = tvm.te.placeholder((rows * width,), "float32", name="data")
    out = tvm.te.compute(data.shape, lambda i: data[i] + 1.0, name="out")
    func = tvm.te.create_prim_func([data, out])
    sch = tvm.s_tir.Schedule(func)
    outer, inner = sch.split(sch.get_loops(sch.get_sblock("out"))[0], [rows, width])
    sch.parallel(outer)
    sch.vectorize(sch.split(inner, [None, 8])[1])
    return sch.mod


def on_bench(measurement: Callable[[Bench], T], what: str) -> T:
    """``measurement`` run on a ``Bench``: this machine's CPU, or within ``measuring_on(tracker)`` one
    session on a server of the tracker, held while it runs. Where that server fails (gone, out of
    time), the measurement is logged as lost and run again from the start on the next server the
    tracker gives, ``ATTEMPTS`` times in all."""
    tracker = measuring_tracker()
    if tracker is None:
        return measurement(Bench(tvm.cpu()))
    for _ in range(ATTEMPTS):
        with tempfile.TemporaryDirectory(prefix="relaxc-rpc-") as folder:
            session = tracker.session()
            try:
                return measurement(Bench(session.cpu(), session, folder))
            except Exception as err:  # noqa: BLE001 - the kernel's own errors go on up
                if not server_failed(err):
                    raise
                log.warning("the RPC server measuring %s failed (%s); measuring it again on another",
                            what, str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__)
                if not tracker.servers():
                    raise RemoteError(f"no RPC server left under {tracker} to measure {what}") from None
            finally:
                del session
    raise RemoteError(f"the RPC servers under {tracker} failed {ATTEMPTS} times measuring {what}")
