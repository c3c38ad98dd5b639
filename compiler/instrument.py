"""The one instrument of a compile: each step timed, logged and, if it made a module, kept.

``Artifact.ir(phase)`` shows the module after any phase and ``report()["phases"]`` their times;
both come from here, for the import, every pipeline phase and the build alike.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import tvm

log = logging.getLogger("relaxc")


class PhaseRecorder:
    """Runs compile steps by name, recording how long each took and the module it produced."""

    def __init__(self) -> None:
        self.timings: list[dict] = []
        self.snapshots: dict[str, tvm.IRModule] = {}

    def run(self, name: str, step: Callable[..., Any], *args: Any) -> Any:
        """``step(*args)``, timed; its result is kept as the snapshot ``name`` if it is a module."""
        start = time.perf_counter()
        result = step(*args)
        seconds = time.perf_counter() - start
        if self.timings and self.timings[-1]["name"] == name:  # a phase run in steps: one entry
            self.timings[-1]["seconds"] += seconds
        else:
            self.timings.append({"name": name, "seconds": seconds})
        log.info("%-9s %6.2fs", name, seconds)
        if isinstance(result, tvm.IRModule):
            self.snapshots[name] = result
        return result

    @property
    def seconds(self) -> float:
        return sum(t["seconds"] for t in self.timings)
