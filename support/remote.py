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

A server serves one session at a time, and TVM's ``RPCSession`` has no ``close()``: a session ends
when the last reference to it, and to every module and tensor from it, is gone. Tracebacks hold the
frames of an error, and a frame kept by a reference cycle holds its callers', so each session relaxc
opens is held in ``_ending`` (MetaSchedule's trials: ended by ``runner_cleanup``), which ends it when
its measurement does, however it ends: with one server, a session left to the garbage collector made
the next request wait for it in vain.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import gc
import logging
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Callable, Iterator, TypeVar

import numpy as np
import tvm
import tvm_ffi.libinfo
from tvm import rpc
from tvm.rpc import base

from relaxc.support import targets
from relaxc.support.errors import RemoteError, message

log = logging.getLogger("relaxc")
T = TypeVar("T")
PROBE_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rpc_probe.c")
PROBE_FILES = ("relaxc_cpuinfo.txt", "relaxc_maps.txt", "relaxc_environ.txt")  # the probe's, in the session's folder
CONNECT_TIMEOUT_S = 10  # a tracker that does not answer by then is not there
WAIT_S = 120  # a request for a server that none answers by then fails (TVM's own request waits forever)
REGISTER_S = 30  # a server gone from the tracker that registers again by then (restarted) is waited for
SESSION_TIMEOUT_S = 600  # a session (one kernel's selection, one dispatch measurement) ends by then
ATTEMPTS = 3  # servers a measurement is tried on before a failing fleet is an error
EVICT_BYTES = 64 << 20  # more than any L3 of the machines seen
CHECKED = ("tvm", "tvm_ffi")  # versions a device must share with this machine (the records' fingerprint)
NO_SERVER = "no RPC server answered"
# what the error of a measurement says where its server failed it, not the kernel: the session ended
# mid-call (RPCCode), the connection broke or was refused, or no server answered. Errors raised on
# the server (RPCError) and session timeouts are the kernel's: a slow kernel is recorded as failed.
SERVER_FAILURES = ("RPCCode::", "ConnectionResetError", "ConnectionRefusedError", "ConnectionAbortedError",
                   "BrokenPipeError", "Connect to ", "Failed to connect", NO_SERVER)
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
        host = host.removeprefix("[").removesuffix("]")  # [::1]:9190
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RemoteError(f"rpc must be HOST:PORT of a TVM RPC tracker, not {address!r}")
        if not key:
            raise RemoteError("rpc needs rpc_key (--rpc-key): the key the devices registered under "
                              "(python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY)")
        return cls(host, int(port), key)

    def __str__(self) -> str:
        return f"{self.host}:{self.port} key {self.key!r}"

    def connect(self) -> rpc.TrackerSession:
        """A connection to the tracker; a RemoteError within ``CONNECT_TIMEOUT_S`` where none answers."""
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

    def any_server(self) -> bool:
        """Whether a server is registered under the key, or registers within ``REGISTER_S`` (one
        restarted, or the only one of its fleet, back after a failure)."""
        deadline = time.monotonic() + REGISTER_S
        while not self.servers():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)
        return True

    def session(self, timeout_s: float = SESSION_TIMEOUT_S, wait_s: float = WAIT_S) -> rpc.RPCSession:
        """A session on the next free server under the key, ended by the server after ``timeout_s``;
        a RemoteError (``NO_SERVER``) where the tracker gives none within ``wait_s``. TVM's tracker
        protocol (``tvm.rpc.base``), as its own request speaks it, but with a deadline: a request
        whose connection closes is dropped by the tracker, and the server goes to the next. After
        ``REGISTER_S`` where no server is registered under the key any more."""
        if not self.any_server():
            raise RemoteError(f"{NO_SERVER}: none is registered under {self} within {REGISTER_S} s")
        try:
            with socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT_S) as sock:
                sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
                if struct.unpack("<i", base.recvall(sock, 4))[0] != base.RPC_TRACKER_MAGIC:
                    raise RemoteError(f"{self.host}:{self.port} is not a TVM RPC tracker")
                sock.settimeout(wait_s)
                base.sendjson(sock, [base.TrackerCode.REQUEST, self.key, "", 1])
                answer = base.recvjson(sock)
        except TimeoutError:
            raise RemoteError(f"{NO_SERVER} under {self} within {wait_s:.0f} s") from None
        except OSError as err:
            raise RemoteError(f"cannot reach the RPC tracker at {self.host}:{self.port} ({err})") from None
        if answer[0] != base.TrackerCode.SUCCESS:
            raise RemoteError(f"the RPC tracker at {self.host}:{self.port} answered {answer!r} to a request")
        host, port, matchkey = answer[1]
        return rpc.connect(host, port, matchkey, session_timeout=timeout_s)


def runner_session(config) -> rpc.RPCSession:
    """MetaSchedule's ``RPCRunner`` session (its ``f_create_session``, run in its workers): as
    ``Tracker.session``, so that a worker never waits forever for a server."""
    tracker = Tracker(config.tracker_host, int(config.tracker_port), config.tracker_key)
    return tracker.session(config.session_timeout_sec)


def runner_cleanup(session: rpc.RPCSession | None, remote_path: str | None) -> None:
    """MetaSchedule's ``RPCRunner`` clean-up (its ``f_cleanup``, run last in each trial, even where it
    raised): its own, then, where the trial raised, the frames of its error cleared and cycles
    collected, so that its session ends when the worker's trial function returns, not at a later
    collection (a trial that succeeds leaves no cycle: its session ends so already)."""
    from tvm.s_tir.meta_schedule.runner.rpc_runner import default_cleanup

    try:
        default_cleanup(session, remote_path)
    finally:
        if sys.exc_info()[1] is not None:
            _clear_frames(sys.exc_info()[1])
            gc.collect()


@contextlib.contextmanager
def _ending(drop: Callable[[], None]) -> Iterator[None]:
    """Within: RPC sessions are held; on leaving, however, ``drop`` lets go of them and they end. The
    frames of an error leaving are cleared of their locals (the modules and tensors of a session they
    held), and reference cycles are collected (a frame in one holds its callers' locals)."""
    try:
        yield
    except BaseException as err:
        _clear_frames(err)
        raise
    finally:
        drop()
        gc.collect()


def _clear_frames(error: BaseException | None) -> None:
    """The locals of the finished frames in the tracebacks of ``error`` and the errors it chains, gone."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__


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
        sessions: list[rpc.RPCSession] = []
        with _ending(sessions.clear):
            sessions += [tracker.session(120) for _ in range(count)]  # all held at once: one per server
            devices = [_probe_one(session, library) for session in sessions]
    return one_kind(devices, tracker)


def one_kind(devices: list[Device], tracker: Tracker) -> Device:
    """The device that every one of ``devices`` (the servers under the tracker's key) is; a
    RemoteError where one has other TVM or tvm-ffi versions than this machine, runs other threads
    than relaxc would (one per core, unpinned: ``support/threads.py``), or they differ."""
    from relaxc.support.versions import code_versions

    local = code_versions()
    for device in devices:
        if device.isa is None:
            raise RemoteError(f"an RPC server under key {tracker.key!r} is not an x86-64 CPU (its /proc/cpuinfo "
                              "lists no flags): relaxc measures x86-64 devices only so far")
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
                          "mix in one store of the cache; register each kind under a key of its own")
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
    except tvm.error.RPCError:  # raised there: a runtime built from source has no such file
        return None
    found = re.search(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text, re.M)
    return found.group(1) if found else None


def server_failed(error: BaseException | str) -> bool:
    """Whether an error (or a trial's error message) is its RPC server's (gone, unreachable, out of
    time), not the kernel's."""
    if isinstance(error, ConnectionError):
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
    """The tracker of the innermost ``measuring_on``; None: this machine measures."""
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
            self._sweep = (self.load(_sweep())["main"], tvm.runtime.empty((EVICT_BYTES // 4,), "float32", self.device))
        sweep, tensor = self._sweep
        sweep(tensor)

    def close(self) -> None:
        """Let go of the session and what the bench put on its server (``_ending`` ends it)."""
        self.device, self.session, self._sweep = tvm.cpu(), None, None

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


def _on_server(measurement: Callable[[Bench], T], tracker: Tracker) -> T:
    """``measurement`` on a session of the tracker, which ends when it returns or raises."""
    with tempfile.TemporaryDirectory(prefix="relaxc-rpc-") as folder:
        session = tracker.session()
        bench = Bench(session.cpu(), session, folder)
        del session  # held by the bench alone, which lets go of it on leaving
        with _ending(bench.close):
            return measurement(bench)


@functools.lru_cache(maxsize=1)
def _sweep() -> tvm.runtime.Executable:
    """A kernel adding 1 to each of ``EVICT_BYTES`` of floats in place, in parallel, built for
    generic x86-64 (any device runs it)."""
    from tvm.script import tirx as T

    rows, lanes = EVICT_BYTES // 4 // 4096, 8

    @T.prim_func
    def sweep(data: T.Buffer((rows * 4096,), "float32")):
        for row in T.parallel(rows):
            for column in range(4096 // lanes):
                for lane in T.vectorized(lanes):
                    data[row * 4096 + column * lanes + lane] = data[row * 4096 + column * lanes + lane] + T.float32(1)

    return tvm.compile(tvm.IRModule({"main": sweep.with_attr("global_symbol", "main")}),
                       target=tvm.target.Target({"kind": "llvm"}))


def on_bench(measurement: Callable[[Bench], T], what: str) -> T:
    """``measurement`` run on a ``Bench``: this machine's CPU, or within ``measuring_on(tracker)`` one
    session on a server of the tracker, held while it runs. Where that server fails (gone, out of
    time), the measurement is logged as lost and run again from the start on the next server the
    tracker gives, ``ATTEMPTS`` times in all."""
    tracker = measuring_tracker()
    if tracker is None:
        return measurement(Bench(tvm.cpu()))
    for _ in range(ATTEMPTS):
        try:
            return _on_server(measurement, tracker)
        except Exception as err:  # noqa: BLE001 - the kernel's own errors go on up
            if not server_failed(err):
                raise
            log.warning("the RPC server measuring %s failed (%s); measuring it again on another", what,
                        message(err, last=True))
        if not tracker.any_server():
            raise RemoteError(f"{NO_SERVER}: none is left under {tracker} to measure {what}")
    raise RemoteError(f"the RPC servers under {tracker} failed {ATTEMPTS} times measuring {what}")
