"""What runs a compiled model, here or deployed: input checks, the VM, exported artifacts.

``Deployed`` (what ``compiler.load`` returns from an exported library and its manifest) and ``Artifact``
(``compiler/build/artifact.py``) share this runner; it imports no onnx, no pipeline: deployment needs TVM's runtime.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from relaxc.runtime import diagnostics, external, weight_file
from relaxc.runtime import device_code, launcher
from relaxc.runtime.generation import Generates
from relaxc.support import index_checks, tvm_log
from relaxc.support.cache_layout import CacheLayout
from relaxc.support.files import file_sha256
from relaxc.support.errors import ExportError, InputError, TargetError, UserError, message
from relaxc.support.subgraphs import ExternalSubgraph
from relaxc.support.tensors import TensorSpec
from relaxc.support.threads import configure_threads, pool_threads

DEVICES = {"cpu": "llvm", "cuda": "cuda", "rocm": "rocm"}  # device -> the target kind it runs


def default_concurrency() -> int:
    """Runs in flight at once per model before further callers wait: two per logical CPU, at least 4.

    More than one per core buys no throughput (docs/concurrency.md measures it); the cap bounds the
    memory concurrent runs take, one arena each.
    """
    return max(4, 2 * (os.cpu_count() or 1))


class VMPool:
    """Idle virtual machines for concurrent runs of one compiled program.

    A Relax VM keeps its registers and call frames in itself, so two threads must never run the same
    one; the program (kernels, constants) is shared. A call takes an idle VM, or makes one while
    fewer than ``limit`` exist, or waits for one to come back. Each run allocates its own arena (the
    planned ``alloc_storage`` is per call), so concurrent runs never share intermediate bytes.
    """

    def __init__(self, program: Any, device: tvm.runtime.Device, limit: int) -> None:
        if limit < 1:
            raise UserError(f"concurrency must be at least 1, got {limit}")
        self._program = program
        self._device = device
        self.limit = limit
        self._idle = [VirtualMachine(program, device)]  # made now: a broken program fails at load
        self._reset()
        _POOLS.add(self)

    def _reset(self) -> None:
        """Fresh locks (after fork, a lock another thread held would stay held); idle VMs are kept."""
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.limit)
        self.created = len(self._idle)

    @contextlib.contextmanager
    def vm(self) -> Iterator[VirtualMachine]:
        with self._slots:
            with self._lock:
                vm = self._idle.pop() if self._idle else None
                if vm is None:
                    self.created += 1
            if vm is None:
                vm = VirtualMachine(self._program, self._device)
            try:
                yield vm
            finally:
                with self._lock:
                    self._idle.append(vm)


_POOLS: "weakref.WeakSet[VMPool]" = weakref.WeakSet()
_forked_thread: int | None = None  # in a forked child: the thread that called fork
_after_fork: ThreadPoolExecutor | None = None


def _reset_after_fork() -> None:
    global _forked_thread, _after_fork
    _forked_thread, _after_fork = threading.get_ident(), None
    for pool in _POOLS:
        pool._reset()


os.register_at_fork(after_in_child=_reset_after_fork)


def _in_usable_thread(call: Callable[[], Any]) -> Any:
    """Run ``call`` on a thread whose TVM thread pool works.

    TVM gives each calling thread a pool of its own workers. ``fork`` copies the forking thread's
    pool but none of its workers, so in the child that thread's parallel kernels would wait forever;
    its calls go through a helper thread of the child instead, whose pool starts fresh. Every other
    thread is unaffected.
    """
    global _after_fork
    if threading.get_ident() != _forked_thread:
        return call()
    if _after_fork is None:
        _after_fork = ThreadPoolExecutor(1, thread_name_prefix="relaxc-after-fork")
    return _after_fork.submit(call).result()


class Runner(Generates):
    """Validates inputs against the compiled signature and runs ``main``, from any number of threads.

    Thread safety: ``run`` may be called from many threads at once; each concurrent call runs on its
    own VM with its own arena (``VMPool``), at most ``concurrency`` at a time, the others wait. A
    forked child may go on running what its parent compiled or loaded (docs/concurrency.md).
    """

    def __init__(self, program: Any, device: tvm.runtime.Device | None, inputs: list[TensorSpec],
                 outputs: list[TensorSpec], concurrency: int | None = None,
                 input_high: dict[str, int] | None = None, subgraphs: Sequence[ExternalSubgraph] = (),
                 program_outputs: list[str] | None = None, dim_bounds: dict[str, int] | None = None,
                 empty_dims: Sequence[str] = (), decoder: dict | None = None) -> None:
        # external subgraphs first: the program calls them by name
        sessions = [external.open_subgraph(sub, pool_threads()) for sub in subgraphs] if device else []
        self._sessions = sessions  # held here: the process keeps them only while a runner does
        opened = list(zip(subgraphs, sessions))
        self._tail = next(((sub, session) for sub, session in opened if sub.tail and sub.serves is None), None)
        self._by_size = [(sub, session) for sub, session in opened if sub.serves is not None]
        self._pool = VMPool(program, device, default_concurrency() if concurrency is None else concurrency) \
            if device else None
        self._device = device
        self.inputs = inputs
        self.outputs = outputs
        self.subgraphs = list(subgraphs)
        self.program_outputs = program_outputs  # what the program returns, where not the outputs
        # a model one library runs whole: the program would only hand the inputs to its tail
        self._hands_inputs_on = self._tail is not None and len(subgraphs) - len(self._by_size) == 1 and \
            set(program_outputs or ()) <= {name for name, _, _ in inputs}
        self.input_high = input_high or {}  # integer inputs' valid ranges, where the model declares them
        # per call, the checks run beside a library's threads spinning between runs, where each
        # bytecode costs several times its price: what can be, is worked out here
        self._names = [name for name, _, _ in inputs]
        self._expected = [(name, tuple(shape), np.dtype(dtype)) for name, shape, dtype in inputs]
        self.dim_bounds = dict(dim_bounds or {})  # each dynamic dim's largest size
        self.empty_dims = frozenset(empty_dims)  # dims that may be 0 (a decoder's past), the others at least 1
        self.decoder = decoder  # a decoder compiled with max_length: what generate() and session() read

    def run(self, *arrays: Any) -> list[np.ndarray]:
        """Run on numpy arrays given in input order or as one ``{name: array}`` dict."""
        self._refuse_single_steps()
        ordered = self._checked(arrays)
        served = self._serving(ordered)  # the whole model, on the backend fastest at this size
        if served is None and self.program_outputs is None:
            return self._program(ordered)
        values = dict(zip(self._names, ordered)) if served else self._program_values(ordered)
        after = served or self._tail
        if after is not None:
            sub, session = after
            values.update(zip([name for name, _, _ in sub.outputs], session.run([values[n] for n in sub.inputs])))
        return [values[name] for name, _, _ in self.outputs]

    def serving(self, *arrays: Any) -> ExternalSubgraph | None:
        """The subgraph that runs the whole model at these inputs' sizes instead of relaxc's
        program (``ExternalSubgraph.serves``), None where the program runs."""
        served = self._serving(self._checked(arrays))
        return None if served is None else served[0]

    def _serving(self, ordered: list[np.ndarray]) -> tuple[ExternalSubgraph, Any] | None:
        if not self._by_size:
            return None
        work = math.prod(self._dims(ordered).values())
        return next(((sub, session) for sub, session in self._by_size if sub.serves[0] <= work < sub.serves[1]), None)

    def program_values(self, *arrays: Any) -> dict[str, np.ndarray]:
        """What relaxc's program returns, by name, before a tail of external subgraphs runs on it:
        the model's outputs it makes and the tail's inputs (to check relaxc's part alone). A program
        that only hands its inputs to the tail (a model one library runs whole) is not run."""
        return self._program_values(self._checked(arrays))

    def _program_values(self, ordered: list[np.ndarray]) -> dict[str, np.ndarray]:
        if self._hands_inputs_on:
            given = dict(zip(self._names, ordered))
            return {name: given[name] for name in self.program_outputs}
        return dict(zip(self.program_outputs or [name for name, _, _ in self.outputs], self._program(ordered)))

    def _program(self, ordered: list[np.ndarray]) -> list[np.ndarray]:
        """relaxc's program on inputs already checked (``_checked``)."""
        try:
            return [tensor.numpy() for tensor in self.call(ordered)]
        except InputError as err:  # an index check failed in the compiled code
            named = {name: value for (name, _, _), value in zip(self.inputs, ordered)}
            raise InputError(index_checks.with_offending_value(str(err), named)) from None

    def call(self, arrays: Sequence[Any], function: str = "main") -> list[tvm.runtime.Tensor]:
        """relaxc's ``function`` (or a decoder's ``decode``) on ``arrays`` in input order (numpy, or device
        tensors and shapes passed as they are), unchecked, its outputs left on the device: for a caller that
        checks its own inputs and keeps tensors from one call to the next (a generation session's cache)."""
        if self._pool is None:
            raise UserError("a GPU artifact runs where its GPU is: export() it, then "
                            "compiler.load(path, device=...) on that machine")
        args = [tvm.runtime.tensor(a, self._device) if isinstance(a, np.ndarray) else a for a in arrays]
        with self._pool.vm() as vm:
            return _tensors(_in_usable_thread(lambda: vm[function](*args)))

    def _checked(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        """The inputs in order, checked against the signature."""
        checked = [self._check(spec, value) for spec, value in zip(self._expected, self._order(arrays))]
        if self.dim_bounds:
            self._dims(checked)
        return checked

    def _dims(self, arrays: list[np.ndarray]) -> dict[str, int]:
        """Each dynamic dim's size in ``arrays``, checked: within its bound and the same in every
        input that has it."""
        sizes: dict[str, tuple[int, str]] = {}
        for (name, shape, _), array in zip(self._expected, arrays):
            for axis, (dim, size) in enumerate(zip(shape, array.shape)):
                if not isinstance(dim, str):
                    continue
                low = int(dim not in self.empty_dims)
                if not low <= size <= self.dim_bounds[dim]:
                    raise InputError(f"input {name!r} dim {axis} ({dim!r}) is {size}, outside its bound "
                                     f"{low}..{self.dim_bounds[dim]} (dim_bounds at compile time)")
                seen = sizes.setdefault(dim, (size, name))
                if seen[0] != size:
                    raise InputError(f"input {name!r} dim {axis} ({dim!r}) is {size}, but input {seen[1]!r} "
                                     f"has {dim} {seen[0]}: inputs sharing a dim must agree")
        return {dim: size for dim, (size, _) in sizes.items()}

    def _order(self, arrays: Sequence[Any]) -> list[Any]:
        names = self._names
        if len(arrays) == 1 and isinstance(arrays[0], Mapping):
            given = arrays[0]
            unknown = [k for k in given if k not in names]
            missing = [n for n in names if n not in given]
            if unknown or missing:
                raise InputError(f"inputs do not match the model: unknown {unknown}, missing {missing}; "
                                 f"expected {names}")
            return [given[n] for n in names]
        if len(arrays) != len(names):
            raise InputError(f"model takes {len(names)} input(s) {names}, got {len(arrays)}")
        return list(arrays)

    @staticmethod
    def _check(spec: tuple[str, tuple[int, ...], np.dtype], value: Any) -> np.ndarray:
        name, shape, dtype = spec
        array = np.asarray(value)
        if array.dtype != dtype and array.dtype.newbyteorder("=") == dtype:
            array = array.astype(dtype)  # the same type in the other byte order (a big-endian file's)
        if array.dtype != dtype:
            raise InputError(f"input {name!r}: expected dtype {dtype}, got {array.dtype}")
        if len(array.shape) != len(shape) or any(isinstance(d, int) and d != size for d, size in zip(shape, array.shape)):
            raise InputError(f"input {name!r}: expected shape {shape}, got {tuple(array.shape)}")
        if array.flags.c_contiguous:
            return array
        return np.require(array, requirements="C")  # ascontiguousarray would make 0-d arrays 1-d


def _tensors(result: Any) -> list[tvm.runtime.Tensor]:
    """The program's outputs, a nested tuple flattened."""
    if isinstance(result, tvm.runtime.Tensor):
        return [result]
    return [item for part in result for item in _tensors(part)]


def open_device(name: str) -> tvm.runtime.Device:
    """The first device of kind ``name``; a clear error when this machine has none."""
    if name not in DEVICES:
        raise UserError(f"unknown device {name!r}; available: {', '.join(DEVICES)}")
    if name == "cpu":
        return tvm.cpu()
    if not tvm.runtime.enabled(name):
        driver = "libcuda.so.1 (the NVIDIA driver)" if name == "cuda" else "the ROCm runtime (libamdhip64)"
        raise TargetError(f"no {name} device: TVM's {name} runtime is not loaded on this machine, "
                          f"{driver} was not found")
    device = tvm.device(name, 0)
    if not device.exist:
        raise TargetError(f"no {name} device is visible on this machine")
    return device


def manifest_path_for(library: str) -> str:
    return os.path.splitext(library)[0] + ".json"


class Deployed(Runner):
    """An exported artifact loaded back for inference."""

    def __init__(self, library: str, manifest: dict, device: str, concurrency: int | None = None,
                 parallel: str = "relaxc", folder: str | None = None) -> None:
        kind = manifest["target"].get("kind")
        if device in DEVICES and DEVICES[device] != kind:
            runs_on = next(d for d, k in DEVICES.items() if k == kind)
            raise TargetError(f"{library} was compiled for {kind!r}: load it with device={runs_on!r}, "
                              f"not {device!r}")
        device_code.register_cuda_binaries(os.path.dirname(library), manifest.get("device_code", []))
        dev = open_device(device)
        self.executable = tvm.runtime.load_module(library)  # as an Artifact's: benchmarks instrument its VM
        # which thread pool runs the kernels' parallel loops: relaxc's launcher, or TVM's and why
        self.launcher = "tvm"
        if kind == "llvm":
            self.launcher = launcher.install(library, pool_threads(), parallel)
            weakref.finalize(self, launcher.release, library)
        super().__init__(self.executable, dev, [spec_from_json(t) for t in manifest["inputs"]],
                         [spec_from_json(t) for t in manifest["outputs"]], concurrency, input_high(manifest["inputs"]),
                         _subgraphs(folder or os.path.dirname(library), manifest), manifest.get("program_outputs"),
                         manifest.get("dim_bounds"), manifest.get("empty_dims", ()), manifest.get("decoder"))
        self.manifest = manifest
        if self.decoder is not None:  # a decoder compiled with max_length: the layout its programs read
            CacheLayout.from_json(self.decoder.get("cache"), library)
        self.weights = weight_file.read(os.path.dirname(library), manifest["weights"][0], dev) \
            if manifest.get("weights") else None

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]


def spec_json(spec: TensorSpec, high: int | None = None) -> dict:
    """A tensor's signature as manifests and reports write it (shape None: decided by the data)."""
    name, shape, dtype = spec
    return {"name": name, "shape": None if shape is None else list(shape), "dtype": dtype,
            **({"high": high} if high is not None else {})}


def spec_from_json(entry: dict) -> TensorSpec:
    return entry["name"], None if entry["shape"] is None else tuple(entry["shape"]), entry["dtype"]


def _subgraphs(folder: str, manifest: dict) -> list[ExternalSubgraph]:
    """The artifact's external subgraphs, read back; a backend missing here, or of another version
    than the one the artifact was compiled with, is an ExportError."""
    subgraphs = []
    for entry in manifest.get("external", []):
        backend = external.get(entry["backend"])
        if not backend.installed():
            raise ExportError(f"the artifact runs a subgraph on {entry['backend']}, which is not installed here: "
                              f"pip install 'relaxc[{backend.extra}]'=={entry['version']} or recompile")
        if backend.version() != entry["version"]:
            raise ExportError(f"the artifact was compiled with {entry['backend']} {entry['version']}, this is "
                              f"{backend.version()}: install that version or recompile")
        with open(os.path.join(folder, entry["file"]), "rb") as f:
            model = f.read()
        subgraphs.append(ExternalSubgraph(entry["backend"], entry["inputs"],
                                          [spec_from_json(o) for o in entry["outputs"]], entry["tail"], model,
                                          entry.get("alone", False),
                                          tuple(entry["serves"]) if entry.get("serves") else None))
    return subgraphs


def input_high(specs: list[dict]) -> dict[str, int]:
    """The integer inputs' exclusive upper bounds (token ids, masks) that a report or manifest records."""
    return {t["name"]: t["high"] for t in specs if "high" in t}


MANIFEST_KEYS = {"target": dict, "inputs": list, "outputs": list, "fingerprint": str, "library": str}


def _read_manifest(path: str) -> dict:
    """The manifest beside ``path``, checked: a broken one is an ExportError, never a crash."""
    manifest_path = manifest_path_for(path)
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ExportError(f"manifest {manifest_path} is missing; export writes it beside the library") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ExportError(f"manifest {manifest_path} is not valid JSON (truncated or corrupted?): {err}") from None
    wrong = [key for key, kind in MANIFEST_KEYS.items() if not isinstance(manifest, dict)
             or not isinstance(manifest.get(key), kind)]
    if wrong:
        raise ExportError(f"manifest {manifest_path} is not a relaxc manifest: {', '.join(wrong)} missing or "
                          f"malformed; re-export the model")
    return manifest


def _verify_files(path: str, manifest: dict) -> None:
    """The library and device code are the bytes export wrote: a truncated or corrupted file would
    crash the process when loaded or run, so it is refused here, before it is opened."""
    folder = os.path.dirname(path)
    files = [(path, manifest.get("library_sha256"))]
    files += [(os.path.join(folder, entry.get("file", "")), entry.get("sha256"))
              for entry in manifest.get("device_code", []) + manifest.get("external", []) + manifest.get("weights", [])]
    for file, expected in files:
        if expected is None:
            continue  # exported before relaxc recorded digests
        if not os.path.isfile(file):
            raise ExportError(f"{file} is missing; it is part of the artifact (see its manifest)")
        if file_sha256(file) != expected:
            raise ExportError(f"{file} does not match its manifest (sha256 differs): the file is truncated, "
                              f"corrupted or from another export; export the model again")


def load(path: str | os.PathLike, device: str | None = None, concurrency: int | None = None,
         parallel: str = "relaxc") -> Deployed:
    """Load an exported artifact (``.so`` plus its ``.json`` manifest) on ``device`` ("cpu", "cuda"
    or "rocm"; default: the kind of device it was compiled for). At most ``concurrency`` runs go at
    once (default ``default_concurrency()``); more callers wait. ``parallel`` picks the CPU thread
    pool: "relaxc" (tasks claimed from a counter, ``codegen/launcher.py``) or "tvm" (TVM's even
    split); ``Deployed.launcher`` says which runs. Files that do not match their manifest are
    refused with an ExportError; a CPU build exported again under a path loaded before in this
    process is loaded from a copy (``_mapped_from``)."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise ExportError(f"no artifact at {path}")
    manifest = _read_manifest(path)
    _verify_files(path, manifest)
    if device is None:
        device = next((d for d, kind in DEVICES.items() if kind == manifest["target"].get("kind")), "cpu")
    configure_threads()
    library = _mapped_from(path, manifest)
    with tvm_log.captured() as said:
        try:
            deployed = Deployed(library, manifest, device, concurrency, parallel, os.path.dirname(path))
        except (RuntimeError, OSError) as err:  # tvm-ffi errors are RuntimeErrors
            raise ExportError(f"cannot load {path}: {message(err, last=True)}") from None
        finally:
            if library != path:
                os.unlink(library)  # mapped: the file is no longer needed
    diagnostics.translate(said)
    return deployed


_MAPPED: dict[str, str] = {}  # library path -> sha256 of the file this process first loaded from it


def _mapped_from(path: str, manifest: dict) -> str:
    """Where to load the CPU library at ``path`` from: ``path``, or a temporary copy where this
    process has loaded another file from that path before. TVM never unloads a library, and the
    dynamic loader gives a path it has loaded the library it loaded, so a model exported again
    under the same path (a notebook's second export) would run the first one."""
    digest = manifest.get("library_sha256") or file_sha256(path)
    if _MAPPED.setdefault(path, digest) == digest or manifest["target"].get("kind") != "llvm":
        return path
    stem, suffix = os.path.splitext(os.path.basename(path))
    descriptor, copy = tempfile.mkstemp(suffix=suffix, prefix=stem + "-")
    os.close(descriptor)
    shutil.copyfile(path, copy)
    return copy


def random_inputs(inputs: Sequence[TensorSpec], seed: int = 0,
                  high: Mapping[str, int] | None = None, dims: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded random inputs for a model's signature: standard normals for floats, 0-1 for
    booleans, integers from 0 up to ``high[name]`` (exclusive; default 10). A bound of 2 (an
    attention mask) gives ones with the last quarter of each row zero, as padded batches have.
    ``dims``: the size of each dynamic dim (by name)."""
    rng = np.random.default_rng(seed)
    high = high or {}
    arrays = {}
    for name, dynamic, dtype in inputs:
        shape = tuple(dims[d] if isinstance(d, str) else d for d in dynamic) if dims else dynamic
        if np.issubdtype(np.dtype(dtype), np.floating):
            arrays[name] = rng.standard_normal(shape).astype(dtype)
        elif high.get(name) == 2 and shape:
            mask = np.ones(shape, dtype)
            mask[..., shape[-1] - shape[-1] // 4:] = 0
            arrays[name] = mask
        else:
            arrays[name] = rng.integers(0, 2 if dtype == "bool" else high.get(name, 10), shape).astype(dtype)
    return arrays
