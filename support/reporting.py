"""The contract between a pass and the compile report.

A pass that has something to say declares ``report_key`` and ``summary()``; after each phase the
pipeline puts ``summary()`` under ``report()[report_key]``. What a pass needs to know for its
report (the names a user knows the inputs by, what an earlier pass found) it is given when it is
constructed, so no one patches a report afterwards.
"""

from __future__ import annotations

from typing import Iterable, Protocol, runtime_checkable


@runtime_checkable
class ReportingPass(Protocol):
    """A pass whose ``summary()`` (JSON-ready) becomes ``report()[report_key]``."""

    report_key: str

    def summary(self) -> dict:
        """What the last run of the pass did."""


def summaries(passes: Iterable[object]) -> dict[str, dict]:
    """The summaries of the reporting passes among ``passes``, by report key."""
    return {p.report_key: p.summary() for p in passes if isinstance(p, ReportingPass)}
