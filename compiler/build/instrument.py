"""The one instrument of a compile: each phase timed, logged and, if it made a module, kept.

``Artifact.ir(phase)`` shows the module after any phase that makes one and ``report()["phases"]``
the seconds of every phase, the report's assembly included: they add up to the compile's wall
time (``report()["compile_seconds"]``) but for the few milliseconds between phases.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import tvm

log = logging.getLogger("relaxc")


class PhaseRecorder:
    """Runs compile phases by name, recording how long each took and the module it produced;
    started with the compile (``start``: when it began, if before the recorder)."""

    def __init__(self, start: float | None = None) -> None:
        self.start = time.perf_counter() if start is None else start
        self.timings: list[dict] = []
        self.snapshots: dict[str, tvm.IRModule] = {}

    def run(self, name: str, step: Callable[..., Any], *args: Any) -> Any:
        """``step(*args)``, timed (a failing one too); its result is kept as the snapshot ``name``
        if it is a module."""
        start = time.perf_counter()
        try:
            result = step(*args)
        finally:
            seconds = time.perf_counter() - start
            self.timings.append({"name": name, "seconds": seconds})
            log.info("%-9s %6.2fs", name, seconds)
        if isinstance(result, tvm.IRModule):
            self.snapshots[name] = result
        return result

    def until_now(self, name: str) -> None:
        """The seconds since the compile started that no entry holds yet, as one entry ``name``."""
        self.timings.append({"name": name, "seconds": self.seconds - sum(t["seconds"] for t in self.timings)})

    def retried(self, first: str, name: str) -> None:
        """The phases from ``first`` on, an attempt that failed and is made again, as one entry
        ``name``; their modules dropped."""
        index = next(i for i, timing in enumerate(self.timings) if timing["name"] == first)
        failed = sum(timing["seconds"] for timing in self.timings[index:])
        self.timings[index:] = [{"name": name, "seconds": failed}]
        self.snapshots = {}

    @property
    def seconds(self) -> float:
        """The wall time since the compile started."""
        return time.perf_counter() - self.start
