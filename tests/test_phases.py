"""The phases of a compile: ``PHASES`` is what docs/pipeline.md and the pipeline's docstring list,
pass by pass, and the seconds of ``report()["phases"]`` are the compile's wall time."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import types

import pytest
import tvm

import relaxc
from relaxc import frontend
from relaxc.build import pipeline
from relaxc.passes.tir import tir_pipeline
from relaxc.support.errors import ImportFailure
from tests import reference
from tests.helpers import ROOT

PIPELINE_DOC = os.path.join(ROOT, "docs", "pipeline.md")
TVM_LOWERING = ("dataflow_lower_passes", "finalize_passes")  # how the table names TVM's per-target passes
ADD_UP = 0.05  # the phases' seconds against the compile's wall time


def doc_table() -> list[tuple[str, list[str]]]:
    """docs/pipeline.md's phase table: each row's phase and the passes it names, in order."""
    with open(PIPELINE_DOC) as f:
        text = f.read()
    header = text.index("| phase | passes |")
    rows = []
    for line in text[header:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    return rows


def _marker(name: str) -> tvm.transform.Pass:
    return tvm.transform.module_pass(lambda mod, _ctx: mod, opt_level=0, name=name)


def phase_passes(monkeypatch) -> dict[str, list[str]]:
    """Each pass phase's passes for a CPU compile, by the names they give themselves, and relaxc's
    TIR passes of the build; TVM's per-target lowering as one name each (its passes are TVM's to
    change)."""
    lowering = types.SimpleNamespace(**{name: (lambda _target, name=name: [_marker(name)]) for name in TVM_LOWERING})
    monkeypatch.setitem(pipeline.TVM_PIPELINES, "llvm", lowering)
    config = relaxc.Options().resolve("cpu")
    imported = frontend.import_model(reference.small_cnn())
    c = pipeline.Compilation(config, model=imported, mod=imported.module)
    with config.target:
        passes = {phase.name: [p.info.name.removeprefix("relaxc.") for p in phase.passes(c)]
                  for phase in pipeline.PHASES if isinstance(phase, pipeline.Phase)}
    tir, _, _ = tir_pipeline._relaxc_pipeline()  # after TVM's own TIR lowering, its first pass
    return passes | {"build": [p.info.name.removeprefix("relaxc.") for p in tir.passes[1:]]}


def test_the_pipeline_doc_lists_every_phase_and_its_passes_in_order(monkeypatch):
    table = doc_table()
    assert [name for name, _ in table] == [phase.name for phase in pipeline.PHASES]
    passes = phase_passes(monkeypatch)
    for name, named in table:
        assert named == passes.get(name, []), f"docs/pipeline.md's {name} row"


def test_the_pipeline_docstring_names_every_phase_in_order_and_its_passes(monkeypatch):
    doc = pipeline.__doc__
    phases = re.findall(r"^    (\w+) ", doc, re.M)
    assert phases == [phase.name for phase in pipeline.PHASES]
    for name, passes in phase_passes(monkeypatch).items():
        missing = [p for p in passes if p not in TVM_LOWERING and p not in doc]
        assert not missing, f"the pipeline's docstring lacks {missing} of {name}"


def test_the_doc_check_catches_a_phase_out_of_order(monkeypatch):
    monkeypatch.setattr(pipeline, "PHASES", pipeline.PHASES[1:] + pipeline.PHASES[:1])
    with pytest.raises(AssertionError):
        test_the_pipeline_doc_lists_every_phase_and_its_passes_in_order(monkeypatch)


def _adds_up(report: dict, wall: float) -> None:
    seconds = sum(phase["seconds"] for phase in report["phases"])
    assert report["compile_seconds"] <= wall
    assert seconds == pytest.approx(wall, rel=ADD_UP), report["phases"]


def test_the_phases_add_up_to_the_compile():
    """Every second of a compile is in a named phase: the import, the backend choice, the passes,
    code generation with its TIR passes, the report and loading the executable."""
    start = time.perf_counter()
    art = relaxc.compile(reference.small_cnn())
    _adds_up(art.report(), time.perf_counter() - start)
    assert [phase["name"] for phase in art.report()["phases"]] == \
        ["startup"] + [phase.name for phase in pipeline.PHASES] + ["report", "load"]


def test_a_first_compile_counts_importing_the_compile_side():
    """A fresh process's first compile imports the pipeline, the passes and TVM's Relax: ``startup``."""
    code = ("import json, time, relaxc; from tests import reference; model = reference.small_cnn(); "
            "start = time.perf_counter(); report = relaxc.compile(model).report(); "
            "print(json.dumps({'wall': time.perf_counter() - start, 'report': report}, default=str))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    found = json.loads(done.stdout.splitlines()[-1])
    _adds_up(found["report"], found["wall"])


def test_a_whole_model_retry_is_timed_as_such(monkeypatch):
    """TVM's importer failing on relaxc's part: the failed attempt's seconds are ``retry``, then the
    phases from import on run again with the whole model on an external backend."""
    pytest.importorskip("onnxruntime")
    convert = frontend.convert

    def failing(prepared, partitioning=frontend.Partitioning()):
        if not partitioning.chosen:
            raise ImportFailure("TVM's importer cannot convert this")
        return convert(prepared, partitioning)

    monkeypatch.setattr(frontend, "convert", failing)
    report = relaxc.compile(reference.small_cnn(), tuning="off", backends="rule").report()
    assert report["backends"]["whole_model_because"].startswith("ImportFailure")
    assert [phase["name"] for phase in report["phases"]][:5] == ["startup", "prepare", "backends", "retry", "import"]
