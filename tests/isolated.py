"""Calling a function in a worker process, so that a crash or a hang becomes an answer instead of
the end of a long run (the conformance suite and the fuzzer use it).

The worker is spawned (a fresh interpreter: no TVM thread pool or lock inherited), keeps serving
calls until it dies, and is replaced then or when a call outlives its timeout. Its stdout and
stderr go to /dev/null: what a case prints is not the runner's output.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
from typing import Any, Callable


HUNG, DIED = "no answer", "worker died"


def _serve(connection, function: Callable[[Any], Any], env: dict[str, str], memory: int | None) -> None:
    os.environ.update(env)  # before TVM's thread pool starts
    if memory is not None:  # an allocation beyond it fails (an error, or the worker dies)
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    while True:
        connection.send(function(connection.recv()))


class Isolated:
    """``call(argument)`` runs ``function(argument)`` (both picklable; the function must not raise)
    in the worker and returns ``(result, "")``, or ``(None, why)`` when the worker died or hung
    (``why`` then starts with ``HUNG`` or ``DIED``). ``memory`` caps the worker's address space in bytes."""

    def __init__(self, function: Callable[[Any], Any], env: dict[str, str] | None = None,
                 memory: int | None = None) -> None:
        self._function, self._env, self._memory = function, dict(env or {}), memory
        self._process = None

    def call(self, argument: Any, timeout: float) -> tuple[Any, str]:
        if self._process is None or not self._process.is_alive():
            self._connection, theirs = multiprocessing.Pipe()
            self._process = multiprocessing.get_context("spawn").Process(
                target=_serve, args=(theirs, self._function, self._env, self._memory), daemon=True)
            self._process.start()
            theirs.close()  # the worker holds its end now: its death reads as end of file here at once
        self._connection.send(argument)
        try:
            if self._connection.poll(timeout):
                return self._connection.recv(), ""
            why = f"{HUNG} in {timeout:.0f} s"
        except (EOFError, OSError):
            self._process.join(1)
            why = f"{DIED} (exit {self._process.exitcode})"
        self.close()
        return None, why

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join()
            self._process = None
