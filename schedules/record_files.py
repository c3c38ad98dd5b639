"""Reading a store's record files: MetaSchedule's JSON database and the selection file.

Each file is read once per process while it is unchanged (keyed by path, size and modification
time): every compile replaying records reads the host's store, and the AVX2 store's record file
took 0.53 s to check line by line for each small model of the test suite. Database files may be
packed (``PACKED``), as the installed package ships them.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import os
import tempfile
from typing import Sequence

from relaxc.support.store_files import PACKED


def json_database(directory: str, allow_missing: bool = True):
    """MetaSchedule's JSON database in ``directory``, kernels matched by structure (it reads the
    files when constructed; ``allow_missing`` creates them)."""
    from tvm.s_tir import meta_schedule as ms

    return ms.database.JSONDatabase(work_dir=directory, module_equality="structural", allow_missing=allow_missing)


def database_of(files: dict[str, Sequence[str]]):
    """A read-only JSONDatabase of these database-file lines."""
    with tempfile.TemporaryDirectory(prefix="relaxc-records-") as copy:
        for name, lines in files.items():
            with open(os.path.join(copy, name), "w") as f:
                f.writelines(lines)
        return json_database(copy, allow_missing=False)


def version(path: str) -> tuple[int, int]:
    """What changes when a file is written: its size and modification time."""
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=8)
def database_lines(path: str, _size: int, _mtime_ns: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The parsable lines of a database file (newline-terminated) and the numbers of the others."""
    kept, bad = [], []
    with gzip.open(path, "rt") if path.endswith(PACKED) else open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            if _parses(line):
                kept.append(line if line.endswith("\n") else line + "\n")
            else:
                bad.append(number)
    return tuple(kept), tuple(bad)


@functools.lru_cache(maxsize=8)
def records_by_workload(lines: tuple[str, ...]) -> tuple[dict[int, list[int]], int]:
    """The positions in ``lines`` (a record file's, as ``database_lines`` holds them) of each
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


# The shipped AVX2 store's 2.3 MB selection file took 87 ms of each compile of a one-operator model to parse.
@functools.lru_cache(maxsize=8)
def selections_in(path: str, _size: int, _mtime_ns: int) -> dict[str, dict]:
    """A selection file's chosen schedule of each kernel (callers copy it before changing it)."""
    with open(path) as f:
        kernels = json.load(f)["kernels"]
    if not isinstance(kernels, dict):
        raise TypeError("'kernels' is not an object")
    return kernels


@functools.lru_cache(maxsize=8)
def indexed_workloads(path: str, _size: int, _mtime_ns: int) -> tuple[list[str], dict[str, int], bytes | None]:
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
