"""TVM's own log, kept off the user's terminal: relaxc prints only its own messages.

TVM 0.27 writes its C++ ``LOG(WARNING)`` lines straight to file descriptor 2, with no run-time
switch for the level (hundreds of ``Scope Loaded:`` lines per ``load``, ``Detected pow(x, y)`` per
kernel). ``captured()`` points fd 2 at a temporary file while relaxc compiles, loads or exports:
TVM's lines are collected for the caller to translate (``compiler/runtime/diagnostics.py``) and any other
line written meanwhile is passed on to the real stderr when the step ends, so nothing is lost,
only delayed (after an internal error, not a UserError, TVM's lines are shown too). relaxc's own messages (its logging, progress bars) go to ``console()``, a copy of
the real stderr, so they show as they happen. ``RELAXC_LOG=debug`` shows TVM's lines too, when the
step ends (the report still gets their translation).

fd 2 belongs to the whole process: while one thread compiles, another thread's stderr is held too
(and passed on when the compile ends); a capture started while one is active leaves it to the first.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from typing import Iterator, TextIO

from relaxc.support.errors import UserError

# "[12:34:56] /project/src/runtime/vm/executable.cc:340: Warning: Scope Loaded:"
TVM_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] \S+?:\d+: (?:(Warning|Error|Info|Debug|Fatal): )?(.*)$")

_lock = threading.Lock()
_active = False
_console: TextIO | None = None


def verbose() -> bool:
    """``RELAXC_LOG=debug``: show TVM's own output too."""
    return os.environ.get("RELAXC_LOG", "").lower() == "debug"


def console() -> TextIO:
    """The real stderr for relaxc's own messages, even while fd 2 is captured."""
    global _console
    with _lock:
        if _console is None:
            _console = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
        return _console


@dataclass
class Capture:
    """What TVM said during a step: its log messages (level, text) and Python warnings."""

    messages: list[tuple[str, str]] = field(default_factory=list)


@contextlib.contextmanager
def captured() -> Iterator[Capture]:
    """Collect TVM's log lines and Python warnings during the block (see the module docstring)."""
    global _active
    capture = Capture()
    console()
    with _lock:
        nested, _active = _active, True
    if nested:  # the outer capture collects this step's lines
        yield capture
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as sink, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            os.dup2(sink.fileno(), 2)
            internal_error = False
            try:
                yield capture
            except BaseException as err:
                internal_error = not isinstance(err, (UserError, KeyboardInterrupt))
                raise
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                sink.seek(0)
                text = sink.read().decode("utf-8", "replace")
                shown = internal_error or verbose()  # a bug: everything TVM said may help
                if shown:
                    sys.stderr.write(text)
                    sys.stderr.flush()
                _sort(text, capture, pass_on=not shown)
                capture.messages += [("Python", f"{w.category.__name__}: {w.message}") for w in caught]
    finally:
        os.close(saved)
        with _lock:
            _active = False


def _sort(text: str, capture: Capture, pass_on: bool = True) -> None:
    """TVM's lines into ``capture`` (a line that does not start a log line continues the previous
    one when it is indented); every other line back to stderr."""
    passed_on, continues = [], False
    for line in text.splitlines():
        match = TVM_LINE.match(line)
        if match:
            capture.messages.append((match.group(1) or "Info", match.group(2)))
        elif continues and line[:1].isspace():
            level, message = capture.messages[-1]
            capture.messages[-1] = (level, f"{message}\n{line}")
            continue
        else:
            passed_on.append(line)
        continues = bool(match)
    if passed_on and pass_on:
        sys.stderr.write("\n".join(passed_on) + "\n")
        sys.stderr.flush()
