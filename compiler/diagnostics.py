"""What TVM said during a step, in relaxc's words: warnings that concern the user's model.

``support.tvm_log`` collects TVM's log; each message is matched against ``KNOWN``: a known message
either becomes a relaxc warning about the model or is internal (said about TVM's own workings,
checked to be harmless). An unknown TVM warning is never hidden: it is reported as it came,
marked as TVM's. ``report()["warnings"]`` holds the warnings, ``report()["tvm_log"]`` every
message with its count.
"""

from __future__ import annotations

import collections
import logging
import re
from typing import Callable, Mapping

from relaxc.support.tvm_log import Capture

log = logging.getLogger("relaxc")

Translate = Callable[[Mapping[str, int]], "str | None"]  # op counts of the model -> warning or None


def _unchecked_indices(ops: Mapping[str, int]) -> str:
    gathers = {op: n for op, n in ops.items() if op.startswith("Gather") or op in ("Embedding",)}
    which = ", ".join(f"{n} {op}" for op, n in sorted(gathers.items())) or "gather/take"
    return (f"indices are not bounds-checked at run time ({which} node(s)): an index input outside the "
            f"data's range (a token id beyond the vocabulary, say) reads arbitrary memory instead of "
            f"failing as onnxruntime does; check index inputs before run()")


# (pattern, translation): None means internal, said about TVM's workings, not the model.
KNOWN: list[tuple[re.Pattern, Translate | None]] = [
    # the VM executable's debug trace of each section it saves or loads
    (re.compile(r"^Scope (Loaded|Saving):"), None),
    # pow(x, n) with n >= 3 is exact for negative x on LLVM: Pow is in the fuzzer's operator set
    (re.compile(r"^Detected pow\(x, y\) where y >= 3"), None),
    (re.compile(r"^Fast mode segfaults when there are out-of-bounds indices"), _unchecked_indices),
]


def translate(capture: Capture, ops: Mapping[str, int] | None = None) -> tuple[list[str], list[dict]]:
    """(warnings for the user, every message with its level and count); the warnings are logged."""
    counts = collections.Counter(capture.messages)
    warnings: list[str] = []
    for (level, message), _ in counts.items():
        known = next(((p, t) for p, t in KNOWN if p.search(message)), None)
        if known is None:
            if level in ("Warning", "Error", "Fatal", "Python"):
                warnings.append(f"TVM ({level.lower()}): {message}")
            continue
        text = known[1](ops or {}) if known[1] is not None else None
        if text is not None and text not in warnings:
            warnings.append(text)
    for warning in warnings:
        log.warning("%s", warning)
    return warnings, [{"level": level, "message": message, "count": n} for (level, message), n in counts.items()]

