"""Looking after the cache as a whole: describe, merge, prune, pack, save and load its stores.

``save`` and ``load`` carry every file of every store (``STORE_FILES``: the records, the manifest,
the selections and each kind of measured decision) from one machine's cache to another's;
``merge`` adds another cache's stores to this one's without losing a local choice
(docs/cache.md).
"""

from __future__ import annotations

import json
import os
import tarfile
import tempfile

from relaxc.schedules import decisions
from relaxc.schedules.cache import RecordStore, stores
from relaxc.schedules.record_files import json_database
from relaxc.support.errors import UserError
from relaxc.support.files import Staging, atomic_write
from relaxc.support.store_files import DATABASE_FILES, DECISION_FILES, STORE_FILES, database_path, pack_store


def describe_store(root: str, key: str) -> dict:
    """What the store ``root/key`` holds: ``RecordStore.describe``, and the entries of each decision
    file with the files that do not parse (``decisions.counts``)."""
    store = RecordStore(os.path.join(root, key))
    return {**store.describe(), **decisions.counts(store.dir)}


def pack(source_root: str, root: str) -> list[str]:
    """Write the stores of ``source_root`` under ``root`` as relaxc ships them (``pack_store``);
    returns the target keys written."""
    keys = stores(source_root)
    for key in keys:
        pack_store(os.path.join(source_root, key), os.path.join(root, key), write=atomic_write)
    return keys


def merge(source_root: str, root: str) -> dict[str, int]:
    """Add every store of ``source_root`` to the store of ``root`` with the same target key: the
    records (workloads matched by structure, so line numbers differ freely), the manifest's
    models, and the selections and decisions this cache lacks (a local one stays). Returns
    records added per key."""
    from tvm.s_tir import meta_schedule as ms

    added = {}
    for key in stores(source_root):
        source_store, store = RecordStore(os.path.join(source_root, key)), RecordStore(os.path.join(root, key))
        if source_store.bad_lines():
            raise UserError(f"{source_store.dir} has unparsable lines; run 'relaxc cache verify'")
        with store.lock():
            records = []
            if source_store.exists():
                source = source_store.database(writable=False)
                destination = store.database(writable=True)
                records = source.get_all_tuning_records()
                for record in records:
                    workload = destination.commit_workload(record.workload.mod)
                    destination.commit_tuning_record(ms.database.TuningRecord(
                        record.trace, workload, record.run_secs, record.target, record.args_info))
            _merge_manifest(source_store.manifest_path, store.manifest_path)
            if source_store.selections():
                store.save_selections(source_store.selections(), replace=False)  # a local choice stays
            for name in DECISION_FILES:  # a local measurement stays
                theirs = decisions.read_entries(os.path.join(source_store.dir, name))
                if theirs:
                    path = os.path.join(store.dir, name)
                    decisions.write_entries(path, {**theirs, **decisions.read_entries(path)})
        added[key] = len(records)
    return added


def prune(root: str) -> dict[str, tuple[int, int]]:
    """Keep only the best record of each workload (the selections, which hold their records, stay);
    returns (records before, after) per key."""
    result = {}
    for key in stores(root, records=True):
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


def save(path: str, root: str) -> str:
    """Archive every file (``STORE_FILES``) of every store under ``root`` to ``path`` (.tar.gz),
    atomically."""
    keys = stores(root)
    if not keys:
        raise UserError(f"nothing cached under {root}")
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
    """Merge the stores of an archive written by ``save`` into the cache ``root``."""
    if not os.path.isfile(path):
        raise UserError(f"no cache archive at {path}")
    with tempfile.TemporaryDirectory(prefix="relaxc-cache-") as unpacked:
        try:
            with tarfile.open(path, "r:gz") as archive:
                archive.extractall(unpacked, filter="data")
        except (tarfile.TarError, OSError) as err:
            raise UserError(f"{path} is not a relaxc cache archive: {err}") from None
        return merge(unpacked, root)
