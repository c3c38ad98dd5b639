"""What an index check says when it fails, written by the pass that compiles it
(``passes/check_indices.py``) and completed by the runtime with the offending value.

The compiled check can only raise a fixed message (TIR's assert has no formatting); where the
indices come straight from a graph input, the runtime finds the first offending value in that
input after the check failed, which costs nothing on calls that pass.
"""

from __future__ import annotations

import re
from typing import Mapping

import numpy as np

_RANGE = re.compile(r"\(indices from input '(?P<input>[^']+)'\): an index is outside the valid range "
                    r"\[(?P<low>[^,]+), (?P<high>[^)]+)\)")


def message(what: str, input_name: str | None, ranges: list[tuple[int, int]]) -> str:
    """The failed check's text: the node, where its indices come from, the valid range (of each
    coordinate, for the ND forms)."""
    source = f" (indices from input {input_name!r})" if input_name else " (indices computed in the model)"
    if len(ranges) == 1:
        return f"{what}{source}: an index is outside the valid range [{ranges[0][0]}, {ranges[0][1]})"
    return f"{what}{source}: an index is outside the valid ranges " + " x ".join(f"[{a}, {b})" for a, b in ranges)


def with_offending_value(text: str, inputs: Mapping[str, np.ndarray]) -> str:
    """``text`` (a failed check's message) with the first offending value and its position, where
    its indices are a graph input among ``inputs`` with one index per element (not the ND forms)."""
    found = _RANGE.search(text)
    if found is None or found["input"] not in inputs:
        return text
    values = np.asarray(inputs[found["input"]])
    outside = np.argwhere((values < int(found["low"])) | (values >= int(found["high"])))
    if not len(outside):
        return text
    position = tuple(int(i) for i in outside[0])
    return f"{text}: {values[position]} at position {list(position)}"
