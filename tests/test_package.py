"""The wheel a user installs: one top-level package, ``relaxc``, small enough for a package index,
with the committed stores of the cache inside it (packed), replayed strictly from any directory."""

import os
import subprocess
import sys
import zipfile

import pytest

from relaxc.support import targets
from tests.helpers import ROOT

WHEEL_LIMIT = 100 * 2**20
ZNVER3 = '{"kind":"llvm","mcpu":"znver3","num-cores":2}'  # a committed store; AVX2 code runs on any CI CPU


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(out), ROOT], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (path,) = out.glob("relaxc-*.whl")
    return str(path)


def test_the_wheel_installs_one_package_with_the_stores_packed(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"relaxc", next(n for n in names if ".dist-info/" in n).split("/")[0]}
    assert os.path.getsize(wheel) < WHEEL_LIMIT
    shipped = {name.split("/")[2] for name in names if name.startswith("relaxc/tuning_logs/")}
    assert shipped == {d for d in os.listdir(os.path.join(ROOT, "tuning_logs"))
                       if os.path.isdir(os.path.join(ROOT, "tuning_logs", d))}
    assert not [n for n in names if n.startswith("relaxc/tuning_logs/") and n.endswith("database_workload.json")]
    assert "relaxc/frontend/zoo/bert.onnx" in names and "relaxc/passes/layout.py" in names
    assert "relaxc/runtime/launcher.c" in names  # export compiles it into each CPU library
    assert "relaxc/support/rpc_probe.c" in names  # sent to RPC servers to ask what they are


@pytest.mark.slow
@pytest.mark.skipif(not targets.runs_on_host(targets.resolve({"kind": "llvm", "mcpu": "znver3"})),
                    reason="this CPU does not run the AVX2 store's code")
def test_the_installed_package_replays_its_store_strictly_from_elsewhere(wheel, tmp_path):
    """Installed (not the checkout), run from an empty directory, with the user's cache empty:
    every kernel of the model has a shipped record, or strict replay refuses it."""
    site = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), wheel],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "RELAXC_CACHE_DIR": str(tmp_path / "cache")}
    where = subprocess.run([sys.executable, "-c", "import relaxc; print(relaxc.__file__)"], cwd=elsewhere, env=env,
                           capture_output=True, text=True, timeout=300)
    assert where.stdout.strip() == str(site / "relaxc" / "__init__.py"), where.stderr
    proc = subprocess.run([sys.executable, "-m", "relaxc", "run", "onnx:squeezenet", "-t", ZNVER3, "--tuning", "strict",
                           "--backends", "rule", "--repeat", "1", "--report", "-q"], cwd=elsewhere, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert f"or relaxc's {site / 'relaxc' / 'tuning_logs' / 'llvm-znver3-2c'}" in proc.stdout
    assert not os.listdir(elsewhere)  # nothing written where it ran
