"""Writing files so that a failure leaves nothing half-written: the one way relaxc writes results.

Every file is written under a temporary name beside its final path (same file system, so the
rename is atomic) and renamed into place only when everything of the group was written; on any
failure the temporaries are removed and the old files, if any, stay as they were.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

SHARED_MODE = 0o644  # mkstemp makes files private; artifacts and records are for others to read


class Staging:
    """A group of files that appear together or not at all::

        with Staging() as staging:
            write_library(staging.path("model.so"))
            write_manifest(staging.path("model.json"))
    """

    def __init__(self) -> None:
        self._pending: list[tuple[str, str]] = []

    def path(self, final: str | os.PathLike) -> str:
        """A temporary path to write ``final`` to (same folder and extension, world-readable)."""
        final = os.fspath(final)
        fd, temp = tempfile.mkstemp(dir=os.path.dirname(final) or ".", prefix=f".{os.path.basename(final)}.",
                                    suffix=os.path.splitext(final)[1])
        os.close(fd)
        self._pending.append((temp, final))
        os.chmod(temp, SHARED_MODE)
        return temp

    def __enter__(self) -> "Staging":
        return self

    def __exit__(self, exc_type, _exc, _tb) -> None:
        try:
            if exc_type is None:
                for temp, final in self._pending:
                    os.replace(temp, final)
        finally:
            for temp, _ in self._pending:
                if os.path.exists(temp):
                    os.unlink(temp)


def atomic_write(path: str | os.PathLike, text: str | bytes) -> None:
    """Write ``text`` (or bytes) to ``path`` in one step, flushed to disk before the rename."""
    with Staging() as staging:
        with open(staging.path(path), "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def file_sha256(path: str) -> str:
    """The SHA-256 of a file's bytes, as manifests record them."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
