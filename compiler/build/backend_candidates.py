"""The whole-model candidates of the backend choice: each built and run once, checked against the
first, timed against the others in alternating blocks, and the memory each holds measured as it is
freed (``compiler/build/backend_choice.py`` says what is measured and how the plan is chosen).

A candidate's memory is the resident memory the process gives back when it is freed after the
timing (garbage collected and freed heap returned to the OS before each reading), so what a
library or TVM sets up once per process is charged to none.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import math
from typing import Callable

import numpy as np
import psutil

from relaxc import frontend
from relaxc.runtime.runner import Runner
from relaxc.support.errors import message
from relaxc.support.turns import block, paired, paired_times, ratio_range, round_medians

log = logging.getLogger("relaxc")

BLOCK_SECONDS = 0.05  # one timed block of a segment's runs
COMPARE_SECONDS = 0.4  # timed runs of each whole-model candidate, at least
SLOWER = 2.0  # a whole-model candidate this much slower than the fastest in one run is not timed further
# candidates within this of the fastest after the first rounds are timed again, longer: six short
# rounds put ResNet-18's relaxc build at 1.17x OpenVINO's and MobileViT-XS's at 1.22x, which
# then timed 0.78x and 0.90x of it over 24 rounds
CLOSE = 1.5
AGREE_RTOL, AGREE_ATOL = 1e-3, 1e-4  # a candidate answers as relaxc does within the project's float32 tolerance
CLOSE_ROUNDS = 24  # rounds of that second comparison, one block of at least BLOCK_SECONDS each
# the two fastest then take CLOSE_ROUNDS more, up to MORE_ROUNDS times, while the range of their
# ratio (``support.turns.ratio_range``) holds 1 and reaches past TIE: over 24 rounds Res2Net-50 timed
# onnxruntime 0.2 % ahead of OpenVINO, which then ran 1.07x (1.05-1.12) ahead of it
TIE, MORE_ROUNDS = 1.03, 3

Build = Callable[[frontend.Prepared, frontend.Partitioning], Runner]
EXPORT = "@export"  # a backend's name so marked: it runs the model as exported, not as relaxc prepared it


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (freed heap handed back to the OS), None where there is none."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c")), "malloc_trim", None)
    except OSError:
        return None


_TRIM = _malloc_trim()


def _differs(outputs: list[np.ndarray], reference: list[np.ndarray]) -> int | None:
    """The first output that differs from ``reference``'s beyond the project's float32 tolerance
    (or in shape), None if none does."""
    for index, (got, want) in enumerate(zip(outputs, reference)):
        atol = AGREE_ATOL * max(1.0, float(np.abs(want).max(initial=0.0)))
        if got.shape != want.shape or not np.allclose(got, want, rtol=AGREE_RTOL, atol=atol, equal_nan=True):
            return index
    return None


class Built:
    """The candidates built and run once on ``inputs``, and why others are none: a build that
    fails, or outputs that differ from the first candidate's (relaxc's kernels with the fallback;
    SSDlite with random weights gets other boxes from OpenVINO than from onnxruntime)."""

    def __init__(self, inputs: dict[str, np.ndarray]) -> None:
        self.inputs = inputs
        self.runners: dict[str, Runner] = {}
        self.rejected: dict[str, str] = {}
        self._reference: tuple[str, list[np.ndarray]] | None = None

    def add(self, name: str, build: Build, prepared: frontend.Prepared, given: frontend.Partitioning) -> None:
        """Build and run the candidate ``name``, or say why it is none: a partition relaxc cannot
        compile (TVM failing on a cut its importer never sees whole) ends this candidate only."""
        try:
            runner = build(prepared, given)
            outputs = [np.array(out) for out in runner.run(self.inputs)]  # arenas and buffers exist after it
        except Exception as err:  # noqa: BLE001 - any failure drops this candidate only, named in the report
            self._reject(name, f"not built: {type(err).__name__}: {message(err)}")
            return
        if self._reference is None:
            self._reference = (name, outputs)
        elif (index := _differs(outputs, self._reference[1])) is not None:
            self._reject(name, f"its output {index} differs from {self._reference[0]}'s")
            return
        self.runners[name] = runner

    def _reject(self, name: str, why: str) -> None:
        self.rejected[name] = why
        log.warning("%s is no candidate for this model: %s", name, why)

    def released(self) -> dict[str, int]:
        """Free the candidates one by one: the resident bytes each gave back (all of them freed)."""
        memory = {}
        before = resident_bytes()
        for name in list(self.runners):
            del self.runners[name]
            after = resident_bytes()
            memory[name], before = max(0, before - after), after
        return memory


def resident_bytes() -> int:
    """The process's resident memory, after collecting garbage and handing freed heap back to the
    OS (glibc's ``malloc_trim``, where there is one): what the live objects hold."""
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)
    return psutil.Process().memory_info().rss


def compare(runners: dict[str, Runner], inputs: dict[str, np.ndarray],
             repeat: int = 20) -> tuple[dict[str, float], list[str]]:
    """Milliseconds of each runner, and the two fastest where their rounds could not tell which is
    faster (``spread`` holding 1; else no names). The runners take turns in blocks of runs (after
    a pause, so the threads of the one before are idle), each block against the fastest's in its round
    (``support.turns.paired``), rounded to microseconds: at least ``repeat`` runs each, and
    enough to last ``COMPARE_SECONDS``. A runner whose faster of two first runs takes over ``SLOWER``
    times the fastest's keeps that time: a cliff in one kernel costs two runs of it (one alone was
    a burst's, now and then, and dropped a library as fast as the fastest). Those within
    ``CLOSE`` of the fastest then take ``CLOSE_ROUNDS`` more rounds, which decide: on a shared VM
    whose blocks move up to 30 % at random, two builds of one program measured 1.01x apart over
    30 rounds, and choices made over 6 picked builds that then timed 1.1-1.3x the fastest. The
    two fastest take more rounds while that does not settle them (``settled``)."""
    calls = {name: (lambda runner=runner: runner.run(inputs)) for name, runner in runners.items()}
    first = {name: min(block(call, 2)) for name, call in calls.items()}
    fastest = min(first.values())
    runs = max(repeat, int(COMPARE_SECONDS * 1e3 / fastest))
    timed = sorted((name for name in calls if first[name] <= SLOWER * fastest), key=first.get)
    ms = first | paired({name: calls[name] for name in timed}, runs)
    best = min(ms[name] for name in timed)
    close = sorted((name for name in timed if ms[name] <= CLOSE * best), key=ms.get)
    tied: list[str] = []
    if len(close) > 1:
        per_block = max(1, math.ceil(BLOCK_SECONDS * 1e3 / ms[close[0]]))
        medians = round_medians({name: calls[name] for name in close}, CLOSE_ROUNDS * per_block, CLOSE_ROUNDS)
        ms |= paired_times(medians)
        top = {name: calls[name] for name in sorted(close, key=ms.get)[:2]}
        medians = {name: medians[name] for name in top}
        for _ in range(MORE_ROUNDS):
            if settled(medians):
                break
            more = round_medians(top, CLOSE_ROUNDS * per_block, CLOSE_ROUNDS)
            medians = {name: medians[name] + more[name] for name in top}
            ms |= paired_times(medians)
        low, high = spread(medians)
        tied = list(top) if low < 1 < high else []
    return {name: round(value, 3) for name, value in ms.items()}, tied


def settled(medians: dict[str, list[float]]) -> bool:
    """Whether the rounds (two runtimes' block medians, ``support.turns.round_medians``) tell which
    is faster, or that they are within ``TIE`` of each other either way (95 % ranges)."""
    low, high = spread(medians)
    return low >= 1 or high <= 1 or (low >= 1 / TIE and high <= TIE)


def spread(medians: dict[str, list[float]]) -> tuple[float, float]:
    """The 95 % range of the second runtime's rounds against the first's (``support.turns.ratio_range``)."""
    first, second = medians
    return ratio_range(medians, second, first)
