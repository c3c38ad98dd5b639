"""Compiled models: run them, export them, load them back with only TVM's runtime.

``Artifact`` is what ``compiler.compile`` returns; ``Deployed`` is what ``compiler.load`` returns
from an exported shared library and its JSON manifest. Both share ``run``, ``inputs`` and
``outputs``. This module must not import onnx or the compiler pipeline: deployment needs neither.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Mapping, Sequence

import numpy as np
import tvm
from tvm import relax
from tvm.target import Target

from compiler import device_code
from compiler.errors import ExportError, InputError, TargetError, UserError

TensorSpec = tuple[str, tuple[int, ...], str]
DEVICES = {"cpu": "llvm", "cuda": "cuda", "rocm": "rocm"}  # device -> the target kind it runs


class _Runner:
    """Validates inputs against the compiled signature and runs the VM's ``main``."""

    def __init__(self, vm: relax.VirtualMachine, device: tvm.runtime.Device,
                 inputs: list[TensorSpec], outputs: list[TensorSpec]) -> None:
        self._vm = vm
        self._device = device
        self.inputs = inputs
        self.outputs = outputs

    def run(self, *arrays: Any) -> list[np.ndarray]:
        """Run on numpy arrays given in input order or as one ``{name: array}`` dict."""
        if self._vm is None:
            raise UserError("a GPU artifact runs where its GPU is: export() it, then "
                            "compiler.load(path, device=...) on that machine")
        ordered = self._order(arrays)
        args = [tvm.runtime.tensor(self._check(spec, value), self._device)
                for spec, value in zip(self.inputs, ordered)]
        return _to_numpy(self._vm["main"](*args))

    def _order(self, arrays: Sequence[Any]) -> list[Any]:
        names = [name for name, _, _ in self.inputs]
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
    def _check(spec: TensorSpec, value: Any) -> np.ndarray:
        name, shape, dtype = spec
        array = np.asarray(value)
        if array.dtype != np.dtype(dtype):
            raise InputError(f"input {name!r}: expected dtype {dtype}, got {array.dtype}")
        if tuple(array.shape) != tuple(shape):
            raise InputError(f"input {name!r}: expected shape {tuple(shape)}, got {tuple(array.shape)}")
        return np.require(array, requirements="C")  # ascontiguousarray would make 0-d arrays 1-d


def _to_numpy(result: Any) -> list[np.ndarray]:
    if isinstance(result, tvm.runtime.Tensor):
        return [result.numpy()]
    return [item for part in result for item in _to_numpy(part)]


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


class Artifact(_Runner):
    """A model compiled for one target: run it, inspect it, export it."""

    def __init__(self, executable: relax.VMExecutable, target: Target, inputs: list[TensorSpec],
                 outputs: list[TensorSpec], report: dict, snapshots: dict[str, tvm.IRModule]) -> None:
        device = open_device("cpu") if target.kind.name == "llvm" else None
        vm = relax.VirtualMachine(executable, device) if device is not None else None
        super().__init__(vm, device, inputs, outputs)
        self.executable = executable
        self.target = target
        self._report = report
        self._snapshots = snapshots

    @property
    def fingerprint(self) -> str:
        return self._report["fingerprint"]

    def report(self) -> dict:
        """What the compiler did: phases and timings, op counts, target, fingerprint (JSON-ready)."""
        return json.loads(json.dumps(self._report))

    def module(self, phase: str = "final") -> tvm.IRModule:
        """The IRModule after ``phase`` (see ``compiler.pipeline.PHASE_NAMES``), to explore or test."""
        if phase not in self._snapshots:
            raise UserError(f"unknown phase {phase!r}; choose one of {', '.join(self._snapshots)}")
        return self._snapshots[phase]

    def ir(self, phase: str = "final") -> str:
        """TVMScript of the module after ``phase`` (see ``compiler.pipeline.PHASE_NAMES``)."""
        return self.module(phase).script(show_meta=False)

    def export(self, path: str | os.PathLike) -> str:
        """Write ``path`` (shared library) and the manifest beside it; returns the manifest path.

        Both files are written to temporary names and renamed into place, so a failure leaves
        nothing behind.
        """
        path = os.path.abspath(os.fspath(path))
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            raise ExportError(f"cannot export to {path}: directory {folder} does not exist")
        if not os.access(folder, os.W_OK):
            raise ExportError(f"cannot export to {path}: directory {folder} is not writable")
        manifest_path = manifest_path_for(path)
        manifest = {key: self._report[key] for key in ("model", "target", "fingerprint", "versions",
                                                         "inputs", "outputs")}
        manifest["library"] = os.path.basename(path)
        temps: list[str] = []
        try:
            lib_tmp = _temp_name(folder, path, temps)
            self.executable.export_library(lib_tmp)
            os.chmod(lib_tmp, 0o755)
            fatbins = []
            if self.target.kind.name == "cuda":
                fatbins = device_code.write_cuda_fatbins(self.executable.mod, str(self.target.attrs["arch"]),
                                                         path, temps)
                manifest["device_code"] = [{k: v for k, v in e.items() if k != "temp"} for e in fatbins]
            manifest_tmp = _temp_name(folder, manifest_path, temps)
            with open(manifest_tmp, "w") as f:
                json.dump(manifest, f, indent=2)
            for entry in fatbins:
                os.replace(entry["temp"], os.path.join(folder, entry["file"]))
            os.replace(lib_tmp, path)
            os.replace(manifest_tmp, manifest_path)
        except OSError as err:
            raise ExportError(f"cannot export to {path}: {err}") from None
        finally:
            for temp in temps:
                if os.path.exists(temp):
                    os.unlink(temp)
        return manifest_path


def _temp_name(folder: str, final: str, temps: list[str]) -> str:
    fd, name = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(final)}.",
                                suffix=os.path.splitext(final)[1])
    os.close(fd)
    os.chmod(name, 0o644)  # mkstemp makes it private; an artifact is for others to deploy
    temps.append(name)
    return name


def manifest_path_for(library: str) -> str:
    return os.path.splitext(library)[0] + ".json"


class Deployed(_Runner):
    """An exported artifact loaded back for inference."""

    def __init__(self, library: str, manifest: dict, device: str) -> None:
        kind = manifest["target"]["kind"]
        if device in DEVICES and DEVICES[device] != kind:
            runs_on = next(d for d, k in DEVICES.items() if k == kind)
            raise TargetError(f"{library} was compiled for {kind!r}: load it with device={runs_on!r}, "
                              f"not {device!r}")
        device_code.register_cuda_binaries(os.path.dirname(library), manifest.get("device_code", []))
        dev = open_device(device)
        vm = relax.VirtualMachine(tvm.runtime.load_module(library), dev)
        spec = lambda t: (t["name"], tuple(t["shape"]), t["dtype"])  # noqa: E731
        super().__init__(vm, dev, [spec(t) for t in manifest["inputs"]], [spec(t) for t in manifest["outputs"]])
        self.manifest = manifest

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]


def load(path: str | os.PathLike, device: str | None = None) -> Deployed:
    """Load an exported artifact (``.so`` plus its ``.json`` manifest) on ``device`` ("cpu", "cuda"
    or "rocm"; default: the kind of device it was compiled for)."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise ExportError(f"no artifact at {path}")
    manifest_path = manifest_path_for(path)
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ExportError(f"manifest {manifest_path} is missing; export writes it beside the library") from None
    except json.JSONDecodeError as err:
        raise ExportError(f"manifest {manifest_path} is not valid JSON: {err}") from None
    if device is None:
        device = next((d for d, kind in DEVICES.items() if kind == manifest["target"]["kind"]), "cpu")
    return Deployed(path, manifest, device)
