"""What TVM said during a step, for the user: its warnings, less those known to be internal.

``support.tvm_log`` collects TVM's log; each message is matched against ``INTERNAL`` (said about
TVM's own workings, checked to be harmless for the model). Any other TVM warning is never hidden:
it is reported as it came, marked as TVM's. ``report()["warnings"]`` holds the warnings,
``report()["tvm_log"]`` every message with its count.
"""

from __future__ import annotations

import collections
import logging
import re

from relaxc.support.tvm_log import Capture

log = logging.getLogger("relaxc")

# TVM messages said about its own workings, checked to be harmless for the model
INTERNAL: list[re.Pattern] = [
    # the VM executable's debug trace of each section it saves or loads
    re.compile(r"^Scope (Loaded|Saving):"),
    # pow(x, n) with n >= 3 is exact for negative x on LLVM: Pow is in the fuzzer's operator set
    re.compile(r"^Detected pow\(x, y\) where y >= 3"),
    # take's "fast" mode reads unchecked: passes/check_indices.py checks every index before it
    re.compile(r"^Fast mode segfaults when there are out-of-bounds indices"),
]


def translate(capture: Capture) -> tuple[list[str], list[dict]]:
    """(warnings for the user, every message with its level and count); the warnings are logged."""
    counts = collections.Counter(capture.messages)
    warnings = [f"TVM ({level.lower()}): {message}" for level, message in counts
                if level in ("Warning", "Error", "Fatal", "Python") and not any(p.search(message) for p in INTERNAL)]
    for warning in warnings:
        log.warning("%s", warning)
    return warnings, [{"level": level, "message": message, "count": n} for (level, message), n in counts.items()]

