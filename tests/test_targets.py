"""What ``target="cpu"`` resolves to, checked for CPUs this machine is not: the name LLVM gives,
corrected by the host's instruction-set features; the vector width; the store it replays; and a
command line that compiles for a CPU with no committed store says so once, in the summary."""

import pytest
from tvm.target import codegen

import relaxc
from relaxc.schedules import cache
from relaxc.support import targets
from tests import reference
from tests.helpers import run_cli

NO_STORE = ("rocketlake", "icelake-server", "sapphirerapids", "skylake-avx512", "haswell")
COMMITTED = {"znver3", "znver4", "znver5", "emeraldrapids"}


def _pretend_host(monkeypatch, name: str, isa: frozenset) -> None:
    monkeypatch.setattr(codegen, "llvm_get_system_cpu", lambda: name)
    monkeypatch.setattr(targets, "host_isa", lambda: isa)


@pytest.mark.parametrize("mcpu", NO_STORE)
def test_cpu_resolves_to_the_host_named_by_llvm_when_its_features_agree(monkeypatch, mcpu):
    _pretend_host(monkeypatch, mcpu, targets.isa("llvm", mcpu))
    target = targets.resolve("cpu")
    assert target.attrs["mcpu"] == mcpu
    assert targets.vector_lanes(target) == (16 if "avx512f" in targets.isa("llvm", mcpu) else 8)
    assert cache.target_key(target).split("-", 1)[1].rsplit("-", 1)[0] not in COMMITTED


def test_a_masked_model_number_is_named_by_the_features():
    """A Sapphire Rapids class VM that LLVM calls rocketlake (AMX, AVX-512 FP16 and BF16 flags):
    named after the CPU with all its features, so it replays that CPU's code."""
    spr = targets.isa("llvm", "sapphirerapids")
    assert spr > targets.isa("llvm", "rocketlake")
    with pytest.MonkeyPatch.context() as patch:
        _pretend_host(patch, "rocketlake", spr)
        assert targets.host_cpu() in ("emeraldrapids", "sapphirerapids")
        assert targets.isa("llvm", targets.host_cpu()) == spr
        _pretend_host(patch, "znver4", targets.isa("llvm", "znver4") - {"avx512bf16"})  # a masked feature
        assert "avx512bf16" not in targets.isa("llvm", targets.host_cpu())


def test_code_runs_where_the_host_has_its_features(monkeypatch):
    monkeypatch.setattr(targets, "host_isa", lambda: targets.isa("llvm", "haswell"))
    assert targets.runs_on_host(targets.resolve({"kind": "llvm", "mcpu": "znver3"}))
    assert not targets.runs_on_host(targets.resolve({"kind": "llvm", "mcpu": "skylake-avx512"}))
    assert not targets.runs_on_host(targets.resolve("cuda:sm_90"))


@pytest.mark.parametrize("mcpu", ["rocketlake", "haswell"])
def test_a_cpu_without_a_store_compiles_quietly_and_says_so_in_the_summary(tmp_path, mcpu):
    """What CI prints on a CPU no committed store is for (compiled for it here, not run)."""
    path = tmp_path / "small.onnx"
    path.write_bytes(reference.small_cnn().SerializeToString())
    target = f'{{"kind":"llvm","mcpu":"{mcpu}","num-cores":2}}'
    proc = run_cli("inspect", path, "-t", target, "-q")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "no records for this CPU there" in proc.stdout
    art = relaxc.compile(reference.small_cnn(), target=target, cache_dir=str(tmp_path))
    assert art.report()["tuning"]["store"] is None
