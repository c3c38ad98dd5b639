"""The layout of a decoder's key/value cache, as its compiled programs read and write it: one small,
versioned object that the cache pass makes (``passes/kv_cache.py``), the report and the manifest
carry (``report()["decoder"]["cache"]``), and a generation session allocates by. A program written for
one layout given a cache of another would read the wrong rows, and the version covers the programs'
cache arguments too (``decode``'s ``write_at``), so a manifest of another version is refused at load.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relaxc.support.errors import ExportError

VERSION = 2


@dataclass(frozen=True)
class CacheLayout:
    """One cache tensor per past input of the export (``pasts``, in the programs' order), each
    ``[batch, heads, rows, dim]``, or ``[batch, heads, dim, rows]`` for the pasts in ``transposed``
    (keys that attention reads in place), ``rows`` the longest sequence rounded up to whole vectors."""

    pasts: tuple[str, ...]
    heads: int
    dim: int
    rows: int
    dtype: str
    transposed: frozenset[str] = frozenset()
    version: int = VERSION

    def shape(self, past: str, batch: int) -> tuple[int, int, int, int]:
        """The cache tensor of ``past`` for ``batch`` rows."""
        return (batch, self.heads, self.dim, self.rows) if past in self.transposed else \
            (batch, self.heads, self.rows, self.dim)

    def bytes(self, batch: int) -> int:
        """Bytes of every cache tensor for ``batch`` rows."""
        return len(self.pasts) * batch * self.heads * self.rows * self.dim * np.dtype(self.dtype).itemsize

    def to_json(self) -> dict:
        return {"version": self.version, "pasts": list(self.pasts), "heads": self.heads, "dim": self.dim,
                "rows": self.rows, "dtype": self.dtype, "transposed": sorted(self.transposed)}

    @classmethod
    def from_json(cls, data: dict | None, source: str = "this decoder") -> CacheLayout:
        """The layout ``data`` describes; an ExportError naming ``source`` where it is of another version
        (or none: written before layouts had one)."""
        version = (data or {}).get("version", 0)
        if version != VERSION:
            raise ExportError(f"{source} keeps its cache in layout version {version}; this relaxc reads version "
                              f"{VERSION}: compile and export it again with this relaxc")
        return cls(tuple(data["pasts"]), int(data["heads"]), int(data["dim"]), int(data["rows"]), str(data["dtype"]),
                   frozenset(data["transposed"]))
