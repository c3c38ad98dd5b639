"""The cache (docs/cache.md): every file the compiles write survives ``save_cache`` and
``load_cache``, strict replay names every kind of missing decision, and the modes' old spellings
are refused naming the new ones."""

import pytest

import relaxc
from relaxc.runtime import external
from relaxc.build import roofline
from relaxc.support import targets
from tests import reference
from tests.helpers import run_cli

MODEL = reference.conv3x3(16, 16, 12, 12, 1)  # one 3x3 convolution: dispatch and layouts both choose
RULES = {"dispatch": "rule", "layouts": "rule", "backends": "rule"}  # nothing replayed


@pytest.mark.skipif(not external.installed(), reason="backends='measure' needs an external backend")
def test_save_and_load_carry_every_file_the_compiles_write(tmp_path):
    """Compiles that measure dispatch, layouts and backends, and a profile's machine figures: every
    file of the store comes back from the archive, byte for byte, and strict replay then finds
    every decision (only tuning records, never tuned here, can be missing)."""
    mine = tmp_path / "mine"
    for measured in ({"dispatch": "measure", "backends": "off"}, {"layouts": "measure", "backends": "off"},
                     {"backends": "measure", "measure_budget_s": 5}):
        relaxc.compile(MODEL, tuning="off", cache_dir=str(mine), **{**RULES, **measured})
    roofline.machine(targets.resolve("cpu"), str(mine))
    (store,) = mine.iterdir()
    written = sorted(path.name for path in store.iterdir() if path.name != ".lock")
    assert written == ["backends.json", "dispatch.json", "layouts.json", "machine.json"]
    archive = relaxc.save_cache(str(tmp_path / "cache.tar.gz"), cache_dir=str(mine))
    relaxc.load_cache(archive, cache_dir=str(tmp_path / "loaded"))
    loaded = tmp_path / "loaded" / store.name
    assert sorted(path.name for path in loaded.iterdir() if path.name != ".lock") == written
    assert all((loaded / name).read_bytes() == (store / name).read_bytes() for name in written)
    for kind in ("dispatch", "layouts", "backends"):
        try:
            relaxc.compile(MODEL, tuning="strict", cache_dir=str(tmp_path / "loaded"),
                           **{**RULES, "backends": "off", kind: "replay"})
        except relaxc.UserError as err:  # the convolution's kernel, where relaxc runs it
            assert "kernels have no tuning record" in str(err)
    roofline.machine(targets.resolve("cpu"), str(tmp_path / "loaded"), strict=True)


@pytest.mark.parametrize("kind", ["dispatch", "layouts"] + (["backends"] if external.installed() else []))
def test_strict_replay_names_a_missing_decision_of_each_kind(tmp_path, kind):
    with pytest.raises(relaxc.UserError, match=rf"tuning='strict': no {kind} decision for .+ in "
                                               rf".+{kind}\.json; compile once with {kind}='measure'"):
        relaxc.compile(MODEL, tuning="strict", cache_dir=str(tmp_path), **{**RULES, kind: "replay"})


def test_strict_replay_names_missing_machine_figures(tmp_path):
    with pytest.raises(relaxc.UserError, match=r"tuning='strict': no machine decision for threads=\d+ in "
                                               r".+machine\.json"):
        roofline.machine(targets.resolve("cpu"), str(tmp_path), strict=True)


@pytest.mark.parametrize("option, old, new", [("dispatch", "heuristic", "rule"), ("backends", "fallback", "rule")])
def test_an_old_mode_spelling_is_refused_naming_the_new_one(option, old, new):
    with pytest.raises(relaxc.UserError, match=rf"{option}='{old}' is spelled '{new}' now"):
        relaxc.compile(MODEL, **{option: old})


def test_backends_relaxc_is_backends_off():
    """``backends="relaxc"`` names what runs the model: relaxc's kernels only, as ``"off"``."""
    assert relaxc.Options(backends="relaxc").resolve("cpu").backends == "off"


def test_the_command_line_names_the_new_spelling_too():
    refused = run_cli("compile", "onnx:squeezenet", "--dispatch-mode", "heuristic", "-q")
    assert refused.returncode == 2 and "dispatch='heuristic' is spelled 'rule' now" in refused.stderr
    assert "heuristic" not in run_cli("compile", "--help").stdout


def test_log_dir_is_the_cache_dir_flag(tmp_path):
    listed = run_cli("cache", "list", "--log-dir", tmp_path)
    assert listed.returncode == 0 and listed.stdout.startswith(f"your cache: {tmp_path} (nothing cached)")
