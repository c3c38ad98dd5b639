"""A CPU relaxc ships no store for starts tuning from the records of a shipped store of its vector
width (``cache.neighbour``), measured on it before the search (``schedules/tuning.py``)."""

import relaxc
from relaxc.schedules import cache
from relaxc.support import targets
from relaxc.support.threads import physical_cores
from tests import reference


def _pair() -> tuple[dict, dict]:
    """Two CPUs of this host's vector width whose code this host runs, as targets with its cores."""
    names = ("skylake-avx512", "cascadelake") if "avx512f" in (targets.host_isa() or ()) else ("haswell", "broadwell")
    return tuple({"kind": "llvm", "mcpu": name, "num-cores": physical_cores()} for name in names)


def test_a_cpu_without_a_store_starts_from_its_neighbours_records(tmp_path, monkeypatch):
    shipped, mine = tmp_path / "shipped", tmp_path / "mine"
    monkeypatch.setattr(cache, "shipped_root", lambda: str(shipped))
    near, new = _pair()
    relaxc.tune(reference.small_cnn(), target=near, trials=4, trials_per_task=2, cache_dir=str(shipped))
    summary = relaxc.tune(reference.small_cnn(), target=new, trials=2, trials_per_task=2, cache_dir=str(mine))
    seeded = summary["from_neighbour"]
    assert seeded["store"].startswith(f"llvm-{near['mcpu']}-") and seeded["kernels"] > 0, summary
    assert summary["records_after"] >= summary["defaults_recorded"] + seeded["kernels"]
    again = relaxc.tune(reference.small_cnn(), target=new, trials=2, trials_per_task=4, cache_dir=str(mine))
    assert "from_neighbour" not in again  # its own records now
    shipped_cpu = targets.resolve(near)  # a CPU relaxc ships a store for starts from none
    assert cache.neighbour(shipped_cpu, cache.store_for(str(mine), shipped_cpu)) is None
