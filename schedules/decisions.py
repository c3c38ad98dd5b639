"""Measured decisions: measured once per target, kept in its store of the cache, replayed after.

Besides the tuning records, a target's store (``schedules/cache.py``) keeps one file per kind of
decision relaxc makes by measuring, each a JSON object ``{"workloads": {key: entry}}``:

- ``dispatch``: each convolution workload's implementations, timed (``schedules/dispatch.py``);
- ``layouts``: each convolution in a layout and each converter, timed (``passes/layout_choice.py``);
- ``backends``: each model's partition among relaxc and the external backends (``compiler/build/backend_choice.py``);
- ``machine``: the CPU's FMA peak and bandwidth per thread count (``compiler/build/roofline.py``);
- ``dynamic``: the record each kernel of dynamic extents replays (``schedules/dynamic_tuning.py``).

Every kind that a compile chooses (dispatch, layouts, backends) takes one of the same ``MODES``:
``measure`` (measure what is not stored, and store it), ``replay`` (what is stored; the built-in
rule where nothing is), ``rule`` (the built-in rule only, nothing read) and ``off`` (no choice at
all; not for layouts, whose rule is the layout pass's own choice). Under
``tuning="strict"`` a decision a compile would replay but the store lacks is an error naming its
kind and key (``DecisionStore.missing``): a CI build then runs what was measured, or fails.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relaxc.support.errors import UserError
from relaxc.support.files import atomic_write
from relaxc.support.store_files import DECISION_FILES

if TYPE_CHECKING:
    from relaxc.schedules.cache import RecordStore

MODES = ("measure", "replay", "rule", "off")
KINDS = dict(zip(("dispatch", "layouts", "backends", "dynamic", "machine"), DECISION_FILES))


@dataclass
class DecisionStore:
    """The decisions of one ``kind`` (a key of ``KINDS``) in a target's store: its own entries over
    those of the store beneath it (the one relaxc ships); written to its own file only.
    ``strict``: a missing decision is an error (``missing``)."""

    store: "RecordStore"
    kind: str
    strict: bool = False

    @property
    def path(self) -> str:
        return os.path.join(self.store.dir, KINDS[self.kind])

    def load(self) -> dict[str, dict]:
        """Every stored entry, this store's own over its base's."""
        entries: dict[str, dict] = {}
        for layer in reversed(self.store.layers()):
            entries.update(read_entries(os.path.join(layer.dir, KINDS[self.kind])))
        return entries

    def save(self, key: str, entry: dict) -> None:
        """Add one entry to the store's own file (the others kept), under the store's lock: written
        to a temporary file and renamed."""
        with self.store.lock():
            write_entries(self.path, {**read_entries(self.path), key: entry})

    def missing(self, key: str, remedy: str) -> None:
        """A decision for ``key`` is not stored: under ``strict`` a UserError naming the kind, the
        key, the file and ``remedy`` (how to measure it); else nothing (the caller falls back)."""
        if self.strict:
            raise UserError(f"tuning='strict': no {self.kind} decision for {key} in {self.path}; {remedy}")


def read_entries(path: str) -> dict[str, dict]:
    """The entries of a decision file (none if it does not exist)."""
    try:
        with open(path) as f:
            return json.load(f)["workloads"]
    except FileNotFoundError:
        return {}
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise UserError(f"{path} is not a valid decision file ({err}); delete it to measure again") from None


def write_entries(path: str, entries: dict[str, dict]) -> None:
    """Write a decision file (atomically)."""
    atomic_write(path, json.dumps({"workloads": entries}, indent=1, sort_keys=True))


def counts(directory: str) -> dict:
    """Entries per decision file of the store in ``directory``, and the files that do not parse."""
    measured, bad = {}, []
    for name in DECISION_FILES:
        try:
            measured[name] = len(read_entries(os.path.join(directory, name)))
        except UserError as err:
            bad.append(str(err))
    return {"measured": measured, "bad_measurements": bad}
