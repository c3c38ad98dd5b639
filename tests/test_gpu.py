"""GPU targets: the bundled models cross-compile and export for CUDA and ROCm here (no GPU needed),
with device code in the artifact; execution on a GPU runs only where one is visible."""

import json
import os
import struct

import onnx
import pytest

import relaxc
from relaxc.frontend import models
from relaxc.build.codegen import toolchain
from relaxc.runtime.runner import open_device
from relaxc.support import targets
from tests import reference
from tests.helpers import run_cli

FATBIN_MAGIC = 0xBA55ED50
EM_AMDGPU = 224


def _gpu_visible(kind: str) -> bool:
    try:
        open_device(kind)
    except relaxc.TargetError:
        return False
    return True


def _amdgpu_objects(data: bytes) -> list[bytes]:
    """The ELF headers inside ``data`` whose machine is AMDGPU (the embedded code objects)."""
    found, start = [], data.find(b"\x7fELF", 1)
    while start != -1:
        if struct.unpack_from("<H", data, start + 18)[0] == EM_AMDGPU:
            found.append(data[start:start + 64])
        start = data.find(b"\x7fELF", start + 1)
    return found


def test_presets_and_fingerprints():
    assert targets.describe(targets.resolve("cuda:sm_90"))["arch"] == "sm_90"
    assert targets.describe(targets.resolve("rocm"))["mcpu"] == targets.DEFAULT_ROCM_ARCH
    cuda = targets.describe(targets.resolve({"kind": "cuda", "arch": "sm_86"}))
    assert cuda["host"]["kind"] == "llvm" and "mcpu" not in cuda["host"]  # portable host code
    for bad, message in (("cuda:90", "not a cuda architecture"), ("rocm:sm_80", "not a rocm architecture"),
                         ("metal", "unknown target 'metal'")):
        with pytest.raises(relaxc.TargetError, match=message):
            targets.resolve(bad)
    sm80 = relaxc.compile(reference.small_cnn(), target="cuda:sm_80")
    sm90 = relaxc.compile(reference.small_cnn(), target="cuda:sm_90")
    assert sm80.fingerprint != sm90.fingerprint
    assert sm80.report()["versions"]["nvcc"].count(".") == 2
    assert sm80.report()["layout"]["block"] == 0 and "until" in sm80.report()["layout"]["why"]
    rocm = relaxc.compile(reference.small_cnn(), target="rocm").report()["versions"]
    assert rocm["rocm_device_libs"] and int(rocm["lld"].split(".")[0]) >= 22
    with pytest.raises(relaxc.UserError, match="arena planner .* CPU-only"):
        relaxc.compile(reference.small_cnn(), target="cuda", memory_planner="arena")


# Every operator form of the bundled models: the Inceptions and DenseNet-121 add none to SqueezeNet
# and ResNet-50 (convolutions, batch norms, pools, concats; Inception v1's stride-1 max pool is the
# same pooling kernel), ZFNet-512 and VGG-19 none to AlexNet (large convolutions, LRN, dense
# layers); nvcc takes 10-50 s a model on 2 cores (58 s for Inception v1).
CUDA_MODELS = tuple(name for name in models.BUNDLED
                    if name not in ("densenet121", "inception_v1", "inception_v2", "zfnet512", "vgg19"))
# ROCm shares CUDA's rules; SqueezeNet's forms and the small CNN's dense layer (exported in
# test_loading_needs_the_gpu) cover its code generation
ROCM_MODELS = ("squeezenet",)


@pytest.mark.slow
@pytest.mark.parametrize("name, kind", [(name, "cuda") for name in CUDA_MODELS] +
                         [(name, "rocm") for name in ROCM_MODELS])
def test_bundled_model_exports_with_device_code(name, kind, tmp_path):
    art = relaxc.compile(f"onnx:{name}", target=kind)
    schedules = art.report()["schedules"]
    assert schedules.get("none", 0) == 0 and "tuned" not in schedules  # every kernel got a GPU schedule
    manifest = json.load(open(art.export(tmp_path / f"{name}.so")))
    library = (tmp_path / f"{name}.so").read_bytes()
    if kind == "cuda":
        (entry,) = manifest["device_code"]
        assert entry["arch"] == targets.DEFAULT_CUDA_ARCH or entry["arch"] == targets.visible_cuda_arch()
        fatbin = (tmp_path / entry["file"]).read_bytes()
        assert struct.unpack_from("<I", fatbin)[0] == FATBIN_MAGIC and len(fatbin) > 10_000
        assert b"__global__" in library  # the kernels' source the fatbin was compiled from
    else:
        objects = _amdgpu_objects(library)
        assert objects, "no AMDGPU code object in the library"
        assert b"amdgcn-amd-amdhsa" in library and targets.DEFAULT_ROCM_ARCH.encode() in library
    with pytest.raises(relaxc.TargetError, match=f"compiled for '{kind}'"):
        relaxc.load(tmp_path / f"{name}.so", device="cpu")


@pytest.mark.parametrize("kind", ["cuda", "rocm"])
def test_loading_needs_the_gpu(kind, tmp_path):
    art = relaxc.compile(reference.small_cnn(), target=kind)
    with pytest.raises(relaxc.UserError, match="runs where its GPU is"):
        art.run(reference.random_inputs(art.inputs))
    art.export(tmp_path / "m.so")
    if _gpu_visible(kind):
        pytest.skip(f"a {kind} GPU is visible: the execution tests cover loading")
    with pytest.raises(relaxc.TargetError, match=f"no {kind} device"):
        relaxc.load(tmp_path / "m.so")  # the device defaults to the artifact's kind
    proc = run_cli("run", str(tmp_path / "m.so"))
    assert proc.returncode == 2 and f"no {kind} device" in proc.stderr


def test_a_missing_tool_is_named(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    toolchain.cuda_home.cache_clear()
    try:
        with pytest.raises(toolchain.ToolchainError, match="needs nvcc on PATH"):
            relaxc.compile(reference.small_cnn(), target="cuda")
    finally:
        toolchain.cuda_home.cache_clear()


def test_missing_fatbin_is_named(tmp_path):
    relaxc.compile(reference.small_cnn(), target="cuda").export(tmp_path / "m.so")
    os.unlink(tmp_path / "m.0.fatbin")
    with pytest.raises(relaxc.ExportError, match="m.0.fatbin is missing"):
        relaxc.load(tmp_path / "m.so", device="cuda")


@pytest.mark.skipif(not _gpu_visible("cuda"), reason="no CUDA GPU visible (CI never has one)")
@pytest.mark.parametrize("name", models.BUNDLED)
def test_bundled_model_matches_onnxruntime_on_cuda(name, tmp_path):
    art = relaxc.compile(f"onnx:{name}", target="cuda")
    art.export(tmp_path / "m.so")
    deployed = relaxc.load(tmp_path / "m.so", device="cuda")
    inputs = reference.random_inputs(deployed.inputs)
    expected = reference.ort_run(onnx.load(models.bundled_path(f"onnx:{name}")), inputs)
    reference.assert_matches(deployed.run(inputs), expected)
