"""The files of a target's store in the cache (``schedules/cache.py``) and the packed form relaxc
ships them in.

Standard library only: the wheel's build (``tools/build_hook.py``) packs the committed stores with
it, where neither TVM nor relaxc is importable.
"""

from __future__ import annotations

import gzip
import os

DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")  # MetaSchedule's JSON database
SELECTION_FILE = "selected.json"  # each kernel's schedule, chosen by measuring candidates side by side
DISPATCH_FILE = "dispatch.json"  # each convolution workload's implementations, measured (schedules/dispatch.py)
LAYOUT_FILE = "layouts.json"  # convolution and converter times of the layout choice (passes/layout_choice.py)
BACKENDS_FILE = "backends.json"  # each model's partition between relaxc and external backends, measured
DYNAMIC_FILE = "dynamic.json"  # the record each kernel of dynamic extents replays, checked and measured
MACHINE_FILE = "machine.json"  # the CPU's FMA peak and bandwidth by thread count (compiler/build/roofline.py)
DECISION_FILES = (DISPATCH_FILE, LAYOUT_FILE, BACKENDS_FILE, DYNAMIC_FILE, MACHINE_FILE)  # schedules/decisions.py
MANIFEST_FILE = "manifest.json"  # the versions the records were tuned with, the models they cover
STORE_FILES = DATABASE_FILES + (MANIFEST_FILE, SELECTION_FILE) + DECISION_FILES  # every file of a store
PACKED = ".gz"  # the database files as shipped: the AVX2 store's 124 MB of workloads take 5.7 MB


def database_path(directory: str, name: str) -> str | None:
    """A database file of a store: the plain one, else the packed one; None if neither exists."""
    for path in (os.path.join(directory, name), os.path.join(directory, name) + PACKED):
        if os.path.exists(path):
            return path
    return None


def pack_store(source: str, destination: str, write=None) -> None:
    """Write the store in ``source`` to ``destination`` as relaxc ships it: the database files
    gzipped (reproducibly: no timestamp), the other files as they are. ``write(path, data)`` writes
    a file (default: a plain write)."""
    os.makedirs(destination, exist_ok=True)
    for name in STORE_FILES:
        path = database_path(source, name) if name in DATABASE_FILES else os.path.join(source, name)
        if path is None or not os.path.exists(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if name in DATABASE_FILES:
            data = gzip.compress(gzip.decompress(data) if path.endswith(PACKED) else data, 6, mtime=0)
            name += PACKED
        (write or _write)(os.path.join(destination, name), data)


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
