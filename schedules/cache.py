"""The cache: what relaxc measured on a target, on disk, shared by every model of the target.

The cache is a directory (``cache_root``) holding one store per target, ``<root>/<target key>/``:
the tuning records (MetaSchedule JSON databases) with a manifest of the versions they were tuned
with and the models (by fingerprint, ``support/versions.py``) they cover, the schedule chosen for
each kernel (``selected.json``), and the measured decisions (``schedules/decisions.py``). This
module finds the stores and reads and writes their records; ``schedules/maintenance.py`` merges,
prunes, saves and loads them. docs/cache.md describes every file; docs/design.md, "The cache
and fingerprint", says why it is kept this way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sys
from typing import Sequence

import tvm
import tvm_ffi
from tvm.target import Target

from relaxc.schedules.record_files import (database_lines, database_of, indexed_workloads, json_database,
                                           records_by_workload, selections_in, version)
from relaxc.support.errors import message
from relaxc.support.files import atomic_write
from relaxc.support.store_files import DATABASE_FILES, MANIFEST_FILE, SELECTION_FILE, STORE_FILES, database_path
from relaxc.support.targets import describe, vector_lanes
from relaxc.support.versions import code_versions


def workload_hash(mod: tvm.IRModule) -> str:
    """A kernel's key in the database files: its structural hash, as MetaSchedule writes it."""
    return str(tvm_ffi.structural_hash(mod) % 2**64)


def mean_seconds(entry: list) -> float:
    """The mean measured run time of a record (the second field of a database line)."""
    run_secs = entry[1]
    return sum(run_secs) / len(run_secs) if run_secs else float("inf")


SHIPPED = "tuning_logs"  # the stores relaxc ships: the checkout's, packed into the installed package
log = logging.getLogger("relaxc")


def cache_root(cache_dir: str | os.PathLike | None = None) -> str:
    """The cache, where measurements are written and read first: ``cache_dir``, else
    ``$RELAXC_CACHE_DIR``, else the user's cache directory (``$XDG_CACHE_HOME/relaxc``,
    ``~/.cache/relaxc``; macOS ``~/Library/Caches/relaxc``)."""
    if cache_dir or os.environ.get("RELAXC_CACHE_DIR"):
        return os.fspath(cache_dir or os.environ["RELAXC_CACHE_DIR"])
    if sys.platform == "darwin":
        return os.path.expanduser("~/Library/Caches/relaxc")
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "relaxc")


def shipped_root() -> str | None:
    """The stores that come with relaxc: ``tuning_logs/`` beside ``schedules/``, which is inside the
    installed package (packed) or the checkout's root (plain); None if there is none."""
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), SHIPPED)  # beside schedules/
    return root if os.path.isdir(root) else None


def store_for(cache_dir: str | os.PathLike | None, target: Target) -> "RecordStore":
    """The records a compile or a tuning run of ``target`` uses. Given a ``cache_dir``: that
    directory's store alone. Else the user's store (``cache_root``), where new records go, over
    the store relaxc ships for the target, which is read only (and left out where it was tuned
    with other versions)."""
    store = RecordStore.of(cache_root(cache_dir), target)
    shipped = shipped_root()
    if cache_dir is None and shipped is not None and os.path.abspath(shipped) != os.path.abspath(cache_root()):
        base = RecordStore.of(shipped, target)
        if base.exists() and not base.compatible():
            log.warning("ignoring %s: its records were tuned with other versions %s", base.dir,
                        base.manifest().get("versions"))
        elif base.exists():
            store.base = base
    return store


def neighbour(target: Target, store: "RecordStore") -> "RecordStore | None":
    """Where relaxc ships no store for ``target``, the shipped store of a CPU of its vector width whose
    records ``store`` could start from (its own CPU's for other cores first, then those of its core
    count, then by name); None where relaxc ships one for ``target`` or none of its width. Kernels depend on the vector width
    (the blocked layouts' blocks), not on the CPU's name: Zen 4, Skylake-AVX512 and Ice Lake server
    compile SqueezeNet to the same 38 kernels, Zen 3 (AVX2) to 3 of them."""
    shipped = shipped_root()
    if shipped is None or target.kind.name != "llvm" or RecordStore.of(shipped, target).exists():
        return None
    lanes, spec = vector_lanes(target), describe(target)
    near = []
    for key in stores(shipped, records=True):  # kind-mcpu-Nc, the mcpu itself perhaps with dashes
        kind, rest = key.split("-", 1)
        mcpu, count = rest.rsplit("-", 1)
        other = Target({"kind": kind, "mcpu": mcpu, "num-cores": int(count.rstrip("c"))})
        candidate = RecordStore.of(shipped, other)
        if vector_lanes(other) == lanes and candidate.compatible() and candidate.dir != store.dir:
            near.append((mcpu != spec.get("mcpu"), f"{spec.get('num-cores')}c" != count, key, candidate))
    return min(near, key=lambda n: n[:3])[3] if near else None


def target_key(target: Target) -> str:
    """Directory name of a target's records: kind, CPU and core count (what tuned code depends on)."""
    spec = describe(target)
    return f"{spec['kind']}-{spec.get('mcpu') or spec.get('arch') or 'generic'}-{spec.get('num-cores') or 'any'}c"


def stores(root: str, records: bool = False) -> list[str]:
    """Target keys under ``root`` that hold a file of a store (``records``: a record database)."""
    if not os.path.isdir(root):
        return []
    names = DATABASE_FILES if records else STORE_FILES
    check = all if records else any
    return sorted(name for name in os.listdir(root)
                  if check(database_path(os.path.join(root, name), f) for f in names))


class RecordStore:
    """One target's store in the cache: its tuning records, a MetaSchedule JSON database plus
    ``manifest.json``, and their selections (its decisions: ``schedules/decisions.py``).

    The manifest records the versions the records were tuned with; records of other versions are
    never applied. Lines that do not parse (a truncated write, garbage) are skipped with a warning
    naming file and line, and every other record still loads. ``lock()`` serialises writers.

    A store may have a ``base`` (the one relaxc ships): its records and choices are read beneath
    this store's own (``selections``, ``records_of``, ``workload``, and each ``DecisionStore``); writes and
    maintenance (``database``, ``prune``, ``describe``) concern this store's own files only. Its
    database files may be packed (``PACKED``), as the installed package ships them: read only.
    """

    def __init__(self, directory: str, base: "RecordStore | None" = None) -> None:
        self.dir = directory
        self.base = base
        self.manifest_path = os.path.join(directory, MANIFEST_FILE)
        self.selection_path = os.path.join(directory, SELECTION_FILE)

    @classmethod
    def of(cls, root: str, target: Target) -> "RecordStore":
        """The store of ``target``'s records under ``root``."""
        return cls(os.path.join(root, target_key(target)))

    def exists(self) -> bool:
        """Whether the store, or its base, has a record database."""
        own = all(database_path(self.dir, name) for name in DATABASE_FILES)
        return own or (self.base is not None and self.base.exists())

    def layers(self) -> list["RecordStore"]:
        """This store's own files first, then its base's."""
        return [self] + (self.base.layers() if self.base is not None else [])

    def lock(self):
        """Exclusive lock on the directory for a writer; a second writer waits for the first."""
        os.makedirs(self.dir, exist_ok=True)
        return _lock(self.dir)

    def manifest(self) -> dict:
        try:
            with open(self.manifest_path) as f:
                return json.load(f)
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError as err:
            log.warning("%s is not valid JSON (%s); treating the records as of unknown versions",
                        self.manifest_path, err)
            return {"versions": {}}

    def compatible(self) -> bool:
        """Whether the records were tuned with this TVM, tvm-ffi and LLVM (so may be applied)."""
        tuned_with = self.manifest().get("versions")
        return tuned_with is None or {k: tuned_with.get(k) for k in code_versions()} == code_versions()

    def update_manifest(self, target: Target, fingerprint: str, entry: dict) -> None:
        """Record what was tuned for ``fingerprint``; written to a temporary file and renamed."""
        manifest = self.manifest()
        manifest["target"] = describe(target)
        manifest["versions"] = code_versions()
        manifest.setdefault("fingerprints", {})[fingerprint] = entry
        atomic_write(self.manifest_path, json.dumps(manifest, indent=2, sort_keys=True))

    def _read(self, name: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The parsable lines of one database file (newline-terminated) and the numbers of the others."""
        path = database_path(self.dir, name)
        if path is None:
            return (), ()
        return database_lines(path, *version(path))

    def bad_lines(self) -> list[tuple[str, int]]:
        """(file, line number) of every line of the database files that does not parse."""
        return [(os.path.join(self.dir, name), number)
                for name in DATABASE_FILES for number in self._read(name)[1]]

    def _clean(self) -> tuple[dict[str, tuple[str, ...]], int]:
        """The parsable lines of each database file and how many were skipped (each one warned about)."""
        clean, skipped = {}, 0
        for name in DATABASE_FILES:
            clean[name], bad = self._checked(name)
            skipped += bad
        return clean, skipped

    def _checked(self, name: str) -> tuple[tuple[str, ...], int]:
        """The parsable lines of one database file, and how many others there were (each warned about)."""
        kept, bad = self._read(name)
        for number in bad:
            log.warning("%s line %d is not a valid record; skipped", os.path.join(self.dir, name), number)
        return kept, len(bad)

    def repair(self) -> None:
        """Drop unparsable lines from the database files (atomically), warning about each one."""
        for name, lines in self._clean()[0].items():
            path = os.path.join(self.dir, name)
            if os.path.exists(path):  # a packed file is never written
                with open(path) as f:
                    if f.read() != "".join(lines):
                        atomic_write(path, "".join(lines))

    def database(self, writable: bool):
        """The MetaSchedule database. Writable: the files themselves (hold ``lock()``). Read-only: the
        files too when every line parses, else a clean copy in a temporary directory, so a reader never
        changes the store (JSONDatabase reads its files when constructed, so the copy can go).

        MetaSchedule can write a record whose trace it then cannot apply (TVM 0.27, a ``mean``'s
        RFactor records: 61 of them after tuning EfficientNet-B0), and one such line makes
        JSONDatabase refuse the whole store. Then the records are checked one by one, those that do
        not apply are dropped with a warning (from the files themselves when writable), and the rest
        is loaded."""
        if writable:
            os.makedirs(self.dir, exist_ok=True)
            self.repair()
            try:
                return json_database(self.dir)
            except RuntimeError:
                clean = self._applicable(self._clean()[0])
                for name, lines in clean.items():
                    atomic_write(os.path.join(self.dir, name), "".join(lines))
                return json_database(self.dir)
        clean, skipped = self._clean()
        plain = all(os.path.exists(os.path.join(self.dir, name)) for name in DATABASE_FILES)
        try:
            return json_database(self.dir, allow_missing=False) if plain and not skipped else database_of(clean)
        except RuntimeError:
            return database_of(self._applicable(clean))

    def _applicable(self, files: dict[str, Sequence[str]]) -> dict[str, Sequence[str]]:
        """``files`` without the records MetaSchedule cannot apply to their workload (each warned about)."""
        from tvm.s_tir import meta_schedule as ms

        workloads = [json.loads(line) for line in files[DATABASE_FILES[0]]]
        parsed: dict[int, object] = {}
        kept = []
        for number, line in enumerate(files[DATABASE_FILES[1]], 1):
            index, record = json.loads(line)
            try:
                if index not in parsed:
                    parsed[index] = ms.database.Workload.from_json(workloads[index])
                ms.database.TuningRecord.from_json(record, parsed[index])
                kept.append(line)
            except Exception:  # noqa: BLE001 - whatever TVM raises, the record cannot be used
                log.warning("%s record %d does not apply to its kernel; dropped",
                            os.path.join(self.dir, DATABASE_FILES[1]), number)
        return {**files, DATABASE_FILES[1]: kept}

    def records_of(self, hashes) -> dict[str, list[str]]:
        """The record lines of each workload in ``hashes`` (see ``workload_hash``) that has any, this
        store's own first, then its base's.

        Reads the workload file's hashes and each record's workload index only; a record line is
        parsed by whoever uses it, so asking for a few kernels of a store of thousands stays cheap."""
        found: dict[str, list[str]] = {}
        for layer in self.layers():
            for key, lines in layer._own_records_of(hashes).items():
                found.setdefault(key, []).extend(lines)
        return found

    def _own_records_of(self, hashes) -> dict[str, list[str]]:
        wanted = set(hashes)
        keys, _ = self._workload_index()
        lines = self._checked(DATABASE_FILES[1])[0]
        by_number, malformed = records_by_workload(lines)
        for _ in range(malformed):
            log.warning("%s: a line that is not a record; skipped", os.path.join(self.dir, DATABASE_FILES[1]))
        at: dict[str, list[int]] = {}
        for number, key in enumerate(keys):  # what records refer to
            if key in wanted and number in by_number:
                at.setdefault(key, []).extend(by_number[number])
        return {key: [lines[i] for i in sorted(positions)] for key, positions in at.items()}

    def workload(self, key: str) -> tvm.tirx.PrimFunc | None:
        """The kernel the records of workload ``key`` were tuned on (their traces name its blocks);
        None if the store has no such workload or its line does not parse (logged)."""
        for layer in self.layers():
            offset = layer._workload_index()[1].get(key)
            if offset is not None:
                return layer._workload_at(key, offset)
        return None

    def _workload_at(self, key: str, offset: int) -> tvm.tirx.PrimFunc | None:
        from tvm.s_tir import meta_schedule as ms

        path = database_path(self.dir, DATABASE_FILES[0])
        unpacked = indexed_workloads(path, *version(path))[2]
        if unpacked is not None:  # a packed file, held unpacked
            end = unpacked.find(b"\n", offset)
            line = unpacked[offset:end if end >= 0 else None]
        else:
            with open(path, "rb") as f:
                f.seek(offset)
                line = f.readline()
        try:
            return ms.database.Workload.from_json(json.loads(line)).mod["main"]
        except Exception as err:  # noqa: BLE001 - whatever TVM raises, the workload cannot be read
            log.warning("%s: workload %s does not parse (%s)", path, key, message(err))
            return None

    def _workload_index(self) -> tuple[list[str], dict[str, int]]:
        """The workload file's hash on each line (by line number, blank lines not counted: what
        records refer to) and each hash's byte offset (``indexed_workloads``)."""
        path = database_path(self.dir, DATABASE_FILES[0])
        if path is None:
            return [], {}
        keys, offsets, _ = indexed_workloads(path, *version(path))
        return keys, offsets

    def best_records(self, hashes) -> dict[str, list]:
        """The fastest record (as measured when tuned) of each workload in ``hashes`` that has any."""
        return {key: min((json.loads(line)[1] for line in lines), key=mean_seconds)
                for key, lines in self.records_of(hashes).items()}

    def selections(self) -> dict[str, dict]:
        """The chosen schedule of each selected kernel, by workload hash (``schedules/selection.py``);
        this store's choice where it and its base both have one."""
        return {**(self.base.selections() if self.base is not None else {}), **self._own_selections()}

    def _own_selections(self) -> dict[str, dict]:
        try:
            return self._selection_file()
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            log.warning("%s is not a valid selection file (%s); ignoring it, the best records apply",
                        self.selection_path, err)
            return {}

    def _selection_file(self) -> dict[str, dict]:
        try:
            return dict(selections_in(self.selection_path, *version(self.selection_path)))
        except FileNotFoundError:
            return {}

    def save_selections(self, entries: dict[str, dict], replace: bool = True) -> None:
        """Record the choices for some kernels (hold ``lock()``), keeping the others; with ``replace``
        False, a kernel that has a choice keeps it. Written to a temporary file and renamed."""
        chosen = self._own_selections()
        taken = self.selections()
        chosen.update(entries if replace else {k: v for k, v in entries.items() if k not in taken})
        atomic_write(self.selection_path, json.dumps({"kernels": chosen}, indent=1, sort_keys=True))

    def describe(self) -> dict:
        """What the store's records hold: record and workload counts, versions, models, unparsable
        lines, selections."""
        manifest = self.manifest()
        workloads, records = (self._read(name)[0] for name in DATABASE_FILES)
        return {
            "target_key": os.path.basename(self.dir),
            "workloads": len(workloads),
            "records": len(records),
            "versions": manifest.get("versions"),
            "compatible": self.compatible(),
            "models": {fp[:12]: {k: v for k, v in entry.items() if k != "tasks"}
                       for fp, entry in manifest.get("fingerprints", {}).items()},
            "bad_lines": [f"{os.path.basename(path)}:{number}" for path, number in self.bad_lines()],
            "selected": len(self._own_selections()),
            "bad_selection": self._selection_problem(),
        }

    def _selection_problem(self) -> str | None:
        try:
            self._selection_file()
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            return f"{SELECTION_FILE}: {err}"
        return None


@contextlib.contextmanager
def _lock(directory: str):
    """Exclusive flock on ``directory/.lock``; says so when it has to wait for another process."""
    with open(os.path.join(directory, ".lock"), "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("waiting for another process writing to %s", directory)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
