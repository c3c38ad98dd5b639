"""The cache of expensive optimisation results (seed 003): fingerprints and tuning records.

Fingerprint: same inputs, same fingerprint; any change to the compiler, TVM, the target, the
toolchain that generates code, or the module's structure gives a new one. Records: MetaSchedule
JSON databases under ``<root>/<target key>/``, shared by every model tuned for that target.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
from importlib import metadata

import tvm
import tvm_ffi
from tvm.target import Target, codegen

from compiler.targets import describe


def versions() -> dict[str, str]:
    """Versions of everything that changes generated code."""
    return {
        "relaxc": metadata.version("relaxc") if _installed("relaxc") else "dev",
        "tvm": tvm.__version__,
        "tvm_ffi": metadata.version("apache-tvm-ffi"),
        "llvm": str(codegen.llvm_version_major()),
    }


def _installed(dist: str) -> bool:
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def fingerprint(module: tvm.IRModule, target: Target, options: dict | None = None) -> str:
    """sha256 over relaxc major.minor, TVM/ffi/LLVM versions, target, options and module structure."""
    info = versions()
    info["relaxc"] = ".".join(info["relaxc"].split(".")[:2])
    payload = {
        "versions": info,
        "target": describe(target),
        "options": options or {},
        "module": tvm_ffi.structural_hash(module),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# --- the record store: MetaSchedule JSON databases under <root>/<target key>/ ----------------------

DEFAULT_ROOT = "tuning_logs"
DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")
log = logging.getLogger("relaxc")


def cache_root(cache_dir: str | os.PathLike | None = None) -> str:
    """Where tuning records live: ``cache_dir``, else ``$RELAXC_CACHE_DIR``, else ``./tuning_logs``."""
    return os.fspath(cache_dir or os.environ.get("RELAXC_CACHE_DIR") or DEFAULT_ROOT)


def target_key(target: Target) -> str:
    """Directory name of a target's records: kind, CPU and core count (what tuned code depends on)."""
    spec = describe(target)
    return f"{spec['kind']}-{spec.get('mcpu') or 'generic'}-{spec.get('num-cores') or 'any'}c"


class RecordStore:
    """The tuning records of one target: a MetaSchedule JSON database plus ``manifest.json``.

    The manifest records the versions the records were tuned with; records of other versions are
    never applied. Lines that do not parse (a truncated write, garbage) are skipped with a warning
    naming file and line, and every other record still loads. ``lock()`` serialises writers.
    """

    def __init__(self, root: str, target: Target) -> None:
        self.target = target
        self.dir = os.path.join(root, target_key(target))
        self.manifest_path = os.path.join(self.dir, "manifest.json")

    def exists(self) -> bool:
        return all(os.path.exists(os.path.join(self.dir, name)) for name in DATABASE_FILES)

    @contextlib.contextmanager
    def lock(self):
        """Exclusive lock on the directory for a writer; a second writer waits for the first."""
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, ".lock"), "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.warning("waiting for another process tuning into %s", self.dir)
                fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

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
        current = {k: v for k, v in versions().items() if k != "relaxc"}
        return tuned_with is None or {k: tuned_with.get(k) for k in current} == current

    def update_manifest(self, fingerprint: str, entry: dict) -> None:
        """Record what was tuned for ``fingerprint``; written to a temporary file and renamed."""
        manifest = self.manifest()
        manifest["target"] = describe(self.target)
        manifest["versions"] = {k: v for k, v in versions().items() if k != "relaxc"}
        manifest.setdefault("fingerprints", {})[fingerprint] = entry
        _atomic_write(self.manifest_path, json.dumps(manifest, indent=2, sort_keys=True))

    def bad_lines(self) -> list[tuple[str, int]]:
        """(file, line number) of every line of the database files that does not parse."""
        bad = []
        for name in DATABASE_FILES:
            path = os.path.join(self.dir, name)
            if not os.path.exists(path):
                continue
            with open(path) as f:
                for number, line in enumerate(f, 1):
                    if line.strip() and not _parses(line):
                        bad.append((path, number))
        return bad

    def repair(self) -> None:
        """Drop unparsable lines from the database files (atomically), warning about each one."""
        for path, number in self.bad_lines():
            log.warning("%s line %d is not a valid record; skipped", path, number)
        for name in DATABASE_FILES:
            path = os.path.join(self.dir, name)
            if os.path.exists(path):
                with open(path) as f:
                    lines = f.readlines()
                kept = [line if line.endswith("\n") else line + "\n" for line in lines
                        if line.strip() and _parses(line)]
                if kept != lines:
                    _atomic_write(path, "".join(kept))

    def database(self, writable: bool):
        """The MetaSchedule database: the files themselves when ``writable`` (hold ``lock()``), else
        a clean copy, so a reader never changes the store."""
        from tvm.s_tir import meta_schedule as ms

        if writable:
            os.makedirs(self.dir, exist_ok=True)
            self.repair()
            return ms.database.JSONDatabase(work_dir=self.dir, module_equality="structural")
        copy = tempfile.mkdtemp(prefix="relaxc-records-")
        bad = set(self.bad_lines())
        for path, number in sorted(bad):
            log.warning("%s line %d is not a valid record; skipped", path, number)
        for name in DATABASE_FILES:
            with open(os.path.join(self.dir, name)) as src, open(os.path.join(copy, name), "w") as dst:
                dst.writelines(line if line.endswith("\n") else line + "\n"
                               for number, line in enumerate(src, 1)
                               if line.strip() and (src.name, number) not in bad)
        return ms.database.JSONDatabase(work_dir=copy, module_equality="structural", allow_missing=False)


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def _atomic_write(path: str, text: str) -> None:
    fd, temp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
