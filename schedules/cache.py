"""The record store: tuning records of every kernel, on disk, shared by every model of a target.

Records are MetaSchedule JSON databases under ``<root>/<target key>/``, with a manifest of the
versions they were tuned with and the models (by fingerprint, ``support/versions.py``) they cover,
and the schedule chosen for each kernel (``selected.json``). docs/design.md, "Record store and
fingerprint", says why it is kept this way.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import gzip
import json
import logging
import os
import sys
import tarfile
import tempfile
from typing import Sequence

import tvm
import tvm_ffi
from tvm.target import Target

from relaxc.support.errors import UserError
from relaxc.support.files import Staging, atomic_write
from relaxc.support.store_files import (BACKENDS_FILE, DATABASE_FILES, DISPATCH_FILE, DYNAMIC_FILE,  # noqa: F401
                                        LAYOUT_FILE, MEASUREMENT_FILES,
                                        PACKED, SELECTION_FILE, STORE_FILES, database_path, pack_store)
from relaxc.support.targets import describe
from relaxc.support.versions import code_versions


def workload_hash(mod: tvm.IRModule) -> str:
    """A kernel's key in the database files: its structural hash, as MetaSchedule writes it."""
    return str(tvm_ffi.structural_hash(mod) % 2**64)


def mean_seconds(entry: list) -> float:
    """The mean measured run time of a record (the second field of a database line)."""
    run_secs = entry[1]
    return sum(run_secs) / len(run_secs) if run_secs else float("inf")


# --- the record store: MetaSchedule JSON databases under <root>/<target key>/ ----------------------

SHIPPED = "tuning_logs"  # the stores relaxc ships: the checkout's, packed into the installed package
log = logging.getLogger("relaxc")


def cache_root(cache_dir: str | os.PathLike | None = None) -> str:
    """Where tuning records are written and read first: ``cache_dir``, else ``$RELAXC_CACHE_DIR``,
    else the user's cache directory (``$XDG_CACHE_HOME/relaxc``, ``~/.cache/relaxc``; macOS
    ``~/Library/Caches/relaxc``)."""
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


def _open_database(path: str):
    """A database file for reading as text, packed or not."""
    return gzip.open(path, "rt") if path.endswith(PACKED) else open(path)


def target_key(target: Target) -> str:
    """Directory name of a target's records: kind, CPU and core count (what tuned code depends on)."""
    spec = describe(target)
    return f"{spec['kind']}-{spec.get('mcpu') or spec.get('arch') or 'generic'}-{spec.get('num-cores') or 'any'}c"


class RecordStore:
    """The tuning records of one target: a MetaSchedule JSON database plus ``manifest.json``.

    The manifest records the versions the records were tuned with; records of other versions are
    never applied. Lines that do not parse (a truncated write, garbage) are skipped with a warning
    naming file and line, and every other record still loads. ``lock()`` serialises writers.

    A store may have a ``base`` (the one relaxc ships): its records and choices are read beneath
    this store's own (``selections``, ``records_of``, ``workload``, ``measurements``); writes and
    maintenance (``database``, ``prune``, ``describe``) concern this store's own files only. Its
    database files may be packed (``PACKED``), as the installed package ships them: read only.
    """

    def __init__(self, directory: str, base: "RecordStore | None" = None) -> None:
        self.dir = directory
        self.base = base
        self.manifest_path = os.path.join(directory, "manifest.json")
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
        return _database_lines(path, *_version(path))

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
            return json_database(self.dir, allow_missing=False) if plain and not skipped else _database_of(clean)
        except RuntimeError:
            return _database_of(self._applicable(clean))

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
        by_number, malformed = _records_by_workload(lines)
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
        unpacked = _indexed_workloads(path, *_version(path))[2]
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
            log.warning("%s: workload %s does not parse (%s)", path, key, str(err).splitlines()[0])
            return None

    def _workload_index(self) -> tuple[list[str], dict[str, int]]:
        """The workload file's hash on each line (by line number, blank lines not counted: what
        records refer to) and each hash's byte offset (``_indexed_workloads``)."""
        path = database_path(self.dir, DATABASE_FILES[0])
        if path is None:
            return [], {}
        keys, offsets, _ = _indexed_workloads(path, *_version(path))
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
            return dict(_selections_in(self.selection_path, *_version(self.selection_path)))
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
        """What the store holds: record and workload counts, versions, models, unparsable lines,
        dispatch and layout measurements."""
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
            **self._measurements(),
        }

    def measurements(self, name: str) -> dict[str, dict]:
        """The workloads measured in the ``MEASUREMENT_FILES`` file ``name``, this store's own over its base's."""
        return {**(self.base.measurements(name) if self.base is not None else {}),
                **read_measurements(os.path.join(self.dir, name))}

    def _measurements(self) -> dict:
        """Workloads measured per ``MEASUREMENT_FILES`` file, and the files that do not parse."""
        measured, bad = {}, []
        for name in MEASUREMENT_FILES:
            try:
                measured[name] = len(read_measurements(os.path.join(self.dir, name)))
            except UserError as err:
                bad.append(str(err))
        return {"measured": measured, "bad_measurements": bad}

    def _selection_problem(self) -> str | None:
        try:
            self._selection_file()
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            return f"{SELECTION_FILE}: {err}"
        return None


def json_database(directory: str, allow_missing: bool = True):
    """MetaSchedule's JSON database in ``directory``, kernels matched by structure (it reads the
    files when constructed; ``allow_missing`` creates them)."""
    from tvm.s_tir import meta_schedule as ms

    return ms.database.JSONDatabase(work_dir=directory, module_equality="structural", allow_missing=allow_missing)


def _database_of(files: dict[str, Sequence[str]]):
    """A read-only JSONDatabase of these database-file lines."""
    with tempfile.TemporaryDirectory(prefix="relaxc-records-") as copy:
        for name, lines in files.items():
            with open(os.path.join(copy, name), "w") as f:
                f.writelines(lines)
        return json_database(copy, allow_missing=False)


def _version(path: str) -> tuple[int, int]:
    """What changes when a file is written: its size and modification time."""
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


# A database file is read once per process while it is unchanged (keyed by path, size and mtime):
# every compile replaying records reads the host's store, and the AVX2 store's record file took
# 0.53 s to check line by line for each small model of the test suite.
@functools.lru_cache(maxsize=8)
def _database_lines(path: str, _size: int, _mtime_ns: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The parsable lines of a database file (newline-terminated) and the numbers of the others."""
    kept, bad = [], []
    with _open_database(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            if _parses(line):
                kept.append(line if line.endswith("\n") else line + "\n")
            else:
                bad.append(number)
    return tuple(kept), tuple(bad)


@functools.lru_cache(maxsize=8)
def _records_by_workload(lines: tuple[str, ...]) -> tuple[dict[int, list[int]], int]:
    """The positions in ``lines`` (a record file's, as ``_database_lines`` holds them) of each
    workload number's records, and how many lines are no record: each compile asks for a few
    kernels' records, and going through the AVX2 store's 10,000 lines took 19 ms of it."""
    by_number: dict[int, list[int]] = {}
    malformed = 0
    for position, line in enumerate(lines):
        try:
            number = int(line[1:line.index(",")])  # [<workload number>,[trace, run_secs, ...]]
        except ValueError:
            malformed += 1
            continue
        by_number.setdefault(number, []).append(position)
    return by_number, malformed


# Read once per process while unchanged, as the database files: the shipped AVX2 store's 2.3 MB
# took 87 ms of each compile of a one-operator model to parse.
@functools.lru_cache(maxsize=8)
def _selections_in(path: str, _size: int, _mtime_ns: int) -> dict[str, dict]:
    """A selection file's chosen schedule of each kernel (callers copy it before changing it)."""
    with open(path) as f:
        kernels = json.load(f)["kernels"]
    if not isinstance(kernels, dict):
        raise TypeError("'kernels' is not an object")
    return kernels


@functools.lru_cache(maxsize=8)
def _indexed_workloads(path: str, _size: int, _mtime_ns: int) -> tuple[list[str], dict[str, int], bytes | None]:
    """A workload file's hash on each line, each hash's byte offset, and the file's bytes if it is
    packed (a replay looks up a workload per kernel whose blocks are named otherwise)."""
    keys: list[str] = []
    offsets: dict[str, int] = {}
    unpacked = gzip.decompress(open(path, "rb").read()) if path.endswith(PACKED) else None
    with open(path, "rb") if unpacked is None else contextlib.nullcontext(unpacked.splitlines(True)) as f:
        offset = 0
        for line in f:
            if line.strip():  # ["<hash>","<base64 module>"]: only the hash is read
                keys.append(line[2:line.find(b'"', 2)].decode())
                offsets.setdefault(keys[-1], offset)
            offset += len(line)
    return keys, offsets, unpacked


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


# --- maintenance: list, verify, merge, prune, save, load -----------------------------------------

def read_measurements(path: str) -> dict[str, dict]:
    """The measured workloads of a ``MEASUREMENT_FILES`` file (none if it does not exist)."""
    try:
        with open(path) as f:
            return json.load(f)["workloads"]
    except FileNotFoundError:
        return {}
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise UserError(f"{path} is not a valid measurement file ({err}); delete it to measure again") from None


def write_measurements(path: str, workloads: dict[str, dict]) -> None:
    atomic_write(path, json.dumps({"workloads": workloads}, indent=1, sort_keys=True))


def stores(root: str) -> list[str]:
    """Target keys under ``root`` that hold a record database."""
    if not os.path.isdir(root):
        return []
    return sorted(name for name in os.listdir(root)
                  if all(database_path(os.path.join(root, name), f) for f in DATABASE_FILES))


def pack(source_root: str, root: str) -> list[str]:
    """Write the stores of ``source_root`` under ``root`` as relaxc ships them (``pack_store``);
    returns the target keys written."""
    keys = stores(source_root)
    for key in keys:
        pack_store(os.path.join(source_root, key), os.path.join(root, key), write=atomic_write)
    return keys


def describe_store(root: str, key: str) -> dict:
    """What the store ``root/key`` holds (see ``RecordStore.describe``)."""
    return RecordStore(os.path.join(root, key)).describe()


def merge(source_root: str, root: str) -> dict[str, int]:
    """Add every record of ``source_root`` to the stores of ``root`` with the same target key;
    returns records added per key. Workloads are matched by structure, so line numbers differ freely."""
    from tvm.s_tir import meta_schedule as ms

    added = {}
    for key in stores(source_root):
        source_store, store = RecordStore(os.path.join(source_root, key)), RecordStore(os.path.join(root, key))
        if source_store.bad_lines():
            raise UserError(f"{source_store.dir} has unparsable lines; run 'relaxc cache verify'")
        source = source_store.database(writable=False)
        with store.lock():
            destination = store.database(writable=True)
            records = source.get_all_tuning_records()
            for record in records:
                workload = destination.commit_workload(record.workload.mod)
                destination.commit_tuning_record(ms.database.TuningRecord(
                    record.trace, workload, record.run_secs, record.target, record.args_info))
            _merge_manifest(source_store.manifest_path, store.manifest_path)
            if source_store.selections():
                store.save_selections(source_store.selections(), replace=False)  # a local choice stays
            for name in MEASUREMENT_FILES:  # dispatch and layout times: a local measurement stays
                theirs = read_measurements(os.path.join(source_store.dir, name))
                if theirs:
                    path = os.path.join(store.dir, name)
                    write_measurements(path, {**theirs, **read_measurements(path)})
        added[key] = len(records)
    return added


def prune(root: str) -> dict[str, tuple[int, int]]:
    """Keep only the best record of each workload (the selections, which hold their records, stay);
    returns (records before, after) per key."""
    result = {}
    for key in stores(root):
        store = RecordStore(os.path.join(root, key))
        with store.lock():
            before = store.describe()["records"]
            staging = tempfile.mkdtemp(prefix=".prune-", dir=store.dir)
            store.database(writable=False).dump_pruned(json_database(staging))
            for name in DATABASE_FILES:
                os.replace(os.path.join(staging, name), os.path.join(store.dir, name))
            os.rmdir(staging)
            result[key] = (before, store.describe()["records"])
    return result


def _merge_manifest(source_path: str, path: str) -> None:
    if not os.path.exists(source_path):
        return
    source = json.load(open(source_path))
    manifest = json.load(open(path)) if os.path.exists(path) else {}
    manifest.setdefault("versions", source.get("versions"))
    manifest.setdefault("target", source.get("target"))
    for fingerprint, entry in source.get("fingerprints", {}).items():
        manifest.setdefault("fingerprints", {}).setdefault(fingerprint, entry)
    atomic_write(path, json.dumps(manifest, indent=2, sort_keys=True))


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


def save(path: str, root: str) -> str:
    """Archive every store under ``root`` (databases, manifests, selections, dispatch and layout
    times) to ``path`` (.tar.gz), atomically."""
    keys = stores(root)
    if not keys:
        raise UserError(f"no tuning records under {root}")
    path = os.path.abspath(path)
    if not os.path.isdir(os.path.dirname(path)):
        raise UserError(f"cannot write {path}: directory {os.path.dirname(path)} does not exist")
    with Staging() as staging:
        with tarfile.open(staging.path(path), "w:gz") as archive:
            for key in keys:
                for name in STORE_FILES:
                    member = database_path(os.path.join(root, key), name) or os.path.join(root, key, name)
                    if os.path.exists(member):
                        archive.add(member, arcname=f"{key}/{os.path.basename(member)}")
    return path


def load(path: str, root: str) -> dict[str, int]:
    """Merge the records of an archive written by ``save`` into the stores under ``root``."""
    if not os.path.isfile(path):
        raise UserError(f"no cache archive at {path}")
    with tempfile.TemporaryDirectory(prefix="relaxc-cache-") as unpacked:
        try:
            with tarfile.open(path, "r:gz") as archive:
                archive.extractall(unpacked, filter="data")
        except (tarfile.TarError, OSError) as err:
            raise UserError(f"{path} is not a relaxc cache archive: {err}") from None
        return merge(unpacked, root)
