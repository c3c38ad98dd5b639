"""A compiled model: run it, inspect what each phase did, export it for deployment.

``Artifact`` is what ``relaxc.compile`` returns. Export writes the shared library, the device code
of GPU targets and a JSON manifest together (``support.files.Staging``), so a failure leaves
nothing behind; ``compiler.load`` (``compiler/runtime/runner.py``) reads them back with TVM's runtime only.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Sequence

import tvm
from tvm import relax
from tvm.target import Target

from relaxc.runtime import diagnostics, weight_file
from relaxc.build.codegen import fatbins
from relaxc.runtime import launcher
from relaxc.runtime.runner import Runner, input_high, manifest_path_for, open_device, spec_json
from relaxc.support.errors import ExportError, UserError
from relaxc.support import tvm_log
from relaxc.support.files import Staging, file_sha256
from relaxc.support.subgraphs import ExternalSubgraph
from relaxc.support.tensors import TensorSpec


class Artifact(Runner):
    """A model compiled for one target: run it, inspect it, export it."""

    def __init__(self, executable: relax.VMExecutable, target: Target, inputs: list[TensorSpec],
                 outputs: list[TensorSpec], report: dict, snapshots: dict[str, tvm.IRModule],
                 subgraphs: Sequence[ExternalSubgraph] = (), program_outputs: list[str] | None = None,
                 weights: list[tvm.runtime.Tensor] | None = None) -> None:
        device = open_device("cpu") if target.kind.name == "llvm" else None
        super().__init__(executable, device, inputs, outputs, input_high=input_high(report["inputs"]),
                         subgraphs=subgraphs, program_outputs=program_outputs, dim_bounds=report["dim_bounds"],
                         empty_dims=report["empty_dims"], decoder=report.get("decoder"))
        self.weights = weights  # a decoder's, lifted out of the program (passes/weights.py): every call's last argument
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

        Every file is written under a temporary name and renamed into place when all are written,
        so a failure leaves nothing behind.
        """
        path = os.path.abspath(os.fspath(path))
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            raise ExportError(f"cannot export to {path}: directory {folder} does not exist")
        if not os.access(folder, os.W_OK):
            raise ExportError(f"cannot export to {path}: directory {folder} is not writable")
        manifest_path = manifest_path_for(path)
        manifest = {key: self._report[key] for key in ("model", "target", "fingerprint", "versions",
                                                         "inputs", "outputs", "dim_bounds", "empty_dims")}
        if "decoder" in self._report:
            manifest["decoder"] = self._report["decoder"]
        manifest["library"] = os.path.basename(path)
        try:
            with tvm_log.captured() as said, Staging() as staging:  # renamed into place in this order: device code, library, manifest
                if self.target.kind.name == "cuda":
                    manifest["device_code"] = fatbins.write_cuda_fatbins(
                        self.executable.mod, str(self.target.attrs["arch"]), path, staging)
                if self.subgraphs:
                    manifest["external"] = self._write_subgraphs(path, staging)
                    manifest["program_outputs"] = self.program_outputs
                library = staging.path(path)
                if self.target.kind.name == "llvm":  # the CPU's thread pool: codegen/launcher.py
                    with tempfile.TemporaryDirectory() as folder:
                        self.executable.export_library(library, addons=[launcher.compile_object(folder)])
                else:
                    self.executable.export_library(library)
                os.chmod(library, 0o755)
                manifest["library_sha256"] = file_sha256(library)
                if self.weights:
                    manifest["weights"] = [weight_file.write(self.weights, path, staging)]
                with open(staging.path(manifest_path), "w") as f:
                    json.dump(manifest, f, indent=2)
                    f.flush()
                    os.fsync(f.fileno())
        except OSError as err:
            raise ExportError(f"cannot export to {path}: {err}") from None
        diagnostics.translate(said)
        return manifest_path

    def _write_subgraphs(self, path: str, staging: Staging) -> list[dict]:
        """Each external subgraph's ONNX slice beside the library, and its manifest entry."""
        versions = self._report["backends"]["versions"]
        entries = []
        for index, sub in enumerate(self.subgraphs):
            name = f"{os.path.splitext(os.path.basename(path))[0]}.external{index}.onnx"
            staged = staging.path(os.path.join(os.path.dirname(path), name))
            with open(staged, "wb") as f:
                f.write(sub.model)
            entries.append({"file": name, "sha256": file_sha256(staged), "backend": sub.backend,
                            "version": versions[sub.backend], "inputs": sub.inputs,
                            "outputs": [spec_json(s) for s in sub.outputs], "tail": sub.tail,
                            "alone": sub.alone, **({"serves": list(sub.serves)} if sub.serves else {})})
        return entries


