"""Continuous batching: one thread owns a decoder's rows (``generation/rows.py``) and runs every
request admitted to them.

Each turn of the loop admits waiting requests to free slots, prefills one prompt (a chunk of at
most ``prefill_chunk`` tokens of it), then steps every row that is decoding, all in one ``decode``:
a request that arrives while others decode joins at the next turn, and a row that ends (its length,
an EOS token, a stop string) or whose client went away leaves at once, its slot free for the next.
A prompt of up to ``prefill_chunk`` tokens is prefilled in one call, as ``generate`` runs it alone, so
its tokens are the bits it gets alone; a longer one stalls the running streams for one chunk a turn.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from relaxc.runtime.generation.rows import Rows
from relaxc.runtime.generation.sampling import Sampling, choose
from relaxc.runtime.serving.text import Output, Text
from relaxc.support.errors import UserError

PREFILL_CHUNK = 512  # tokens a turn: a 512-token prompt prefills as generate() runs it alone


class QueueFull(UserError):
    """More requests wait than the server queues (``max_queue``)."""


@dataclass(eq=False)
class Job:
    """One request: its prompt's ids, how many tokens it may add, how to choose them, its stop strings,
    and ``emit(kind, value)``, called from the scheduler's thread with ``("text", delta)``, then
    ``("end", (finish_reason, completion_tokens))`` or ``("error", message)``."""

    prompt: list[int]
    max_tokens: int
    sampling: Sampling
    emit: Callable[[str, Any], None]
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    cancelled: bool = False
    slot: int | None = None
    prefilled: int = 0
    tokens: list[int] = field(default_factory=list)
    output: Output | None = None
    rng: np.random.Generator | None = None


class Scheduler:
    """The thread that runs ``rows`` (``generation.Rows``) for the jobs submitted; ``text`` decodes
    their tokens. ``max_queue`` jobs may wait for a slot."""

    def __init__(self, rows: Rows, text: Text, max_queue: int = 64, prefill_chunk: int = PREFILL_CHUNK) -> None:
        self.rows = rows
        self.text, self.max_queue, self.prefill_chunk = text, max_queue, prefill_chunk
        self.steps = 0  # decode steps run: rows stepped together count once
        self._waiting: collections.deque[Job] = collections.deque()
        self._prefilling: list[Job] = []
        self._decoding: list[Job] = []
        self._wake = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="relaxc-scheduler", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> int:
        """Jobs holding a slot."""
        return len(self._prefilling) + len(self._decoding)

    def submit(self, job: Job) -> None:
        """Queue ``job``; ``QueueFull`` where ``max_queue`` already wait."""
        with self._wake:
            if self._closing:
                raise QueueFull("the server is shutting down")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests already wait for a slot (--max-queue {self.max_queue})")
            self._waiting.append(job)
            self._wake.notify()

    def cancel(self, job: Job) -> None:
        """Drop ``job`` (its client went away): its slot is freed at the next turn."""
        job.cancelled = True
        with self._wake:
            self._wake.notify()

    def close(self) -> None:
        """Stop: every job not finished ends with an error; returns when the thread has."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._closing and not self._waiting and not self.busy:
                    self._wake.wait()
                if self._closing:
                    break
                self._admit()
            self._drop_cancelled()
            if self._prefilling:
                self._guarded([self._prefilling[0]], self._prefill)
            if self._decoding:
                self._guarded(list(self._decoding), self._step)
        for job in [*self._waiting, *self._prefilling, *self._decoding]:
            job.emit("error", "the server is shutting down")

    def _admit(self) -> None:
        taken = {job.slot for job in self._prefilling + self._decoding}
        free = [slot for slot in range(self.rows.slots) if slot not in taken]
        while self._waiting and free:
            job = self._waiting.popleft()
            if job.cancelled:
                continue
            job.slot = free.pop(0)
            job.output, job.rng = Output(self.text, job.stop), np.random.default_rng(job.seed)
            self.rows.free(job.slot)
            self._prefilling.append(job)

    def _drop_cancelled(self) -> None:
        for jobs in (self._prefilling, self._decoding):
            jobs[:] = [job for job in jobs if not job.cancelled]

    def _guarded(self, jobs: list[Job], run: Callable[[list[Job]], None]) -> None:
        """``run(jobs)``; an exception ends those jobs with it as their error, never the thread."""
        try:
            run(jobs)
        except Exception as err:  # noqa: BLE001 -- reported to each client, the server goes on
            for job in jobs:
                self._leave(job)
                job.emit("error", f"{type(err).__name__}: {err}")

    def _prefill(self, jobs: list[Job]) -> None:
        job, = jobs
        chunk = job.prompt[job.prefilled:job.prefilled + self.prefill_chunk]
        logits = self.rows.prefill(job.slot, np.asarray(chunk, np.int64))
        job.prefilled += len(chunk)
        if job.prefilled == len(job.prompt):
            self._prefilling.remove(job)
            self._decoding.append(job)
            self._next(job, logits)

    def _step(self, jobs: list[Job]) -> None:
        logits = self.rows.step([job.slot for job in jobs], [job.tokens[-1] for job in jobs])
        self.steps += 1
        for job, row in zip(jobs, logits):
            self._next(job, row)

    def _next(self, job: Job, logits: np.ndarray) -> None:
        """Choose ``job``'s next token from ``logits``, send its text, end it where it ends."""
        token = int(choose(logits[None], np.zeros((1, 0), bool), job.sampling, job.rng)[0])
        job.tokens.append(token)
        eos = token in self.text.eos
        delta = "" if eos else job.output.add(token)
        if delta:
            job.emit("text", delta)
        if eos or job.output.stopped:
            self._finish(job, "stop")
        elif len(job.tokens) == job.max_tokens:
            self._finish(job, "length")

    def _finish(self, job: Job, reason: str) -> None:
        rest = job.output.flush()
        if rest:
            job.emit("text", rest)
        self._leave(job)
        job.emit("end", (reason, len(job.tokens)))

    def _leave(self, job: Job) -> None:
        for jobs in (self._prefilling, self._decoding):
            if job in jobs:
                jobs.remove(job)
