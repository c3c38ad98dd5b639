"""A session: one conversation's cache over a decoder artifact, kept between calls.

``append(ids)`` runs the prompt (or a user's next turn) through the model at once and returns the
logits of its last position; ``step(tokens)`` runs one token per row; ``reset()`` empties the cache.
The cache is the model's keys and values, one tensor per past of the export allocated at the first
``append`` for ``max_length`` rows and written in place by each step (``passes/kv_cache.py``); every
row of a batch is cached to the same length, rows shorter than others padded on the left with a mask.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import tvm_ffi

from relaxc.support.cache_layout import CacheLayout
from relaxc.support.errors import InputError, UserError


class Session:
    """One conversation (``batch`` rows) over ``runner``, a decoder compiled with ``max_length``:
    ``decoder`` is its ``report()["decoder"]``. Not for two threads at once: give each its own."""

    def __init__(self, runner: Any, decoder: dict) -> None:
        self._runner = runner
        self.decoder = decoder
        self.max_length, self.max_batch, self.vocab = decoder["max_length"], decoder["max_batch"], decoder["vocab"]
        self.layout = CacheLayout.from_json(decoder.get("cache"))
        self._inputs = [name for name, _, _ in runner.inputs]
        if runner.subgraphs:
            raise UserError("generation runs relaxc's program alone: compile the decoder with backends='relaxc' "
                            f"(here {len(runner.subgraphs)} subgraph(s) run on another runtime)")
        self._busy = threading.Lock()
        self.reset()

    @property
    def length(self) -> int:
        """Tokens cached, padding included: what the next step's keys and values extend."""
        return self._mask.shape[1]

    @property
    def batch(self) -> int | None:
        """Rows of this session: set by its first ``append``, None before."""
        return None if self._caches is None else self._mask.shape[0]

    @property
    def cache_bytes(self) -> int:
        """Bytes of this session's cache: allocated at its first ``append`` for ``max_length`` tokens
        of its rows, 0 before."""
        return sum(_nbytes(cache) for cache in (self._caches or {}).values())

    def reset(self) -> None:
        """Empty the cache: the next ``append`` starts a new conversation, of any batch."""
        self._caches: dict[str, Any] | None = None  # by past input name, on the device
        self._mask = np.zeros((0, 0), np.int64)

    def append(self, input_ids: Any, attention_mask: Any = None, all_positions: bool = False) -> np.ndarray:
        """Run ``input_ids`` [batch, n] (a 1-D sequence is one row) after what is cached; returns the
        logits of the last position [batch, vocab] (of every position [batch, n, vocab] if
        ``all_positions``, for a decoder compiled with ``all_logits=True``). ``attention_mask`` (0 for
        left padding) defaults to every token."""
        if all_positions and not self.decoder.get("all_logits"):
            raise UserError("this decoder keeps the last position's logits alone: compile it with all_logits=True "
                            "for every position's")
        ids = self.check_ids(input_ids)
        mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, np.int64)
        if mask.shape != ids.shape:
            raise InputError(f"attention_mask has shape {mask.shape}, input_ids {ids.shape}: one entry per token")
        if self._caches is None:
            if ids.shape[0] > self.max_batch:
                raise UserError(f"a batch of {ids.shape[0]} rows is more than max_batch={self.max_batch} "
                                "(compile with a larger max_batch)")
            self._caches = {past: self._runner.call_zeros(self.layout.shape(past, ids.shape[0]), self.layout.dtype)
                            for past in self.layout.pasts}
            self._mask = np.zeros((ids.shape[0], 0), np.int64)
        elif ids.shape[0] != self.batch:
            raise InputError(f"this session has {self.batch} rows; input_ids has {ids.shape[0]} (reset() first)")
        self.check_room(ids.shape[1])
        if not self.decoder.get("padding", True) and not mask.all():
            raise UserError("this export counts positions from the cache's length, not from attention_mask, and "
                            "relaxc found no position lookup to feed: a left-padded row would get positions shifted "
                            "by its padding; give rows of equal length (docs/generation.md)")
        logits = self._run(ids, mask)
        return logits if all_positions else logits[:, -1]

    def step(self, tokens: Any) -> np.ndarray:
        """Run one token per row (int64 [batch]); returns the next logits [batch, vocab]."""
        if self._caches is None:
            raise UserError("a session's first call is append(input_ids): there is nothing to step from")
        ids = self.check_ids(np.asarray(tokens).reshape(-1, 1))
        if ids.shape[0] != self.batch:
            raise InputError(f"step takes one token per row: {self.batch}, not {ids.shape[0]}")
        self.check_room(1)
        return self._run(ids, np.ones_like(ids), "decode")[:, -1]  # passes/decode.py's one-token program

    def check_ids(self, input_ids: Any) -> np.ndarray:
        """``input_ids`` as int64 [batch, n], every id in the vocabulary; an InputError otherwise."""
        ids = np.asarray(input_ids)
        if ids.ndim == 1:
            ids = ids[None]
        if ids.ndim != 2 or ids.shape[1] == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise InputError(f"input_ids must be whole numbers [batch, tokens], at least one token; got "
                             f"{ids.dtype} {ids.shape}")
        check_vocabulary(ids, self.vocab)
        return ids.astype(np.int64)

    def check_room(self, tokens: int) -> None:
        """A UserError, before any work, where ``tokens`` more would not fit in ``max_length``."""
        if self.length + tokens > self.max_length:
            raise UserError(f"{self.length} tokens cached and {tokens} more is over max_length={self.max_length} "
                            "(compile with a larger max_length, or reset())")

    def step_arguments(self, tokens: Any) -> list[Any]:
        """The arguments of the program's ``decode`` for ``step(tokens)``, which is not run: to profile a
        decode step (``relaxc.build.profile.profile(art, {}, arguments=..., function="decode")``) at this length."""
        if self._caches is None:
            raise UserError("a session's first call is append(input_ids): there is nothing to step from")
        ids = self.check_ids(np.asarray(tokens).reshape(-1, 1))
        self.check_room(1)
        return self._arguments(ids, np.concatenate([self._mask, np.ones_like(ids)], axis=1), "decode")

    def _arguments(self, ids: np.ndarray, full: np.ndarray, function: str) -> list[Any]:
        feeds = {"input_ids": ids, "attention_mask": full}
        if self.decoder["positions"]:  # transformers' positions: each token's count of real ones before it
            feeds["position_ids"] = np.maximum(np.cumsum(full, axis=1) - 1, 0)[:, -ids.shape[1]:]
        if self.decoder.get("cache_position"):  # transformers': the rows the new tokens take in the cache
            feeds["cache_position"] = np.arange(self.length, self.length + ids.shape[1], dtype=np.int64)
        feeds.update(self._caches)
        at = [tvm_ffi.Shape([self.length])]
        if function == "decode":  # every row's cache as long as the others (rows.py gives each its own)
            at.append(np.full(ids.shape[0], self.length, np.int64))
        return [feeds[name] for name in self._inputs] + at + self._runner.weight_argument()

    def _run(self, ids: np.ndarray, mask: np.ndarray, function: str = "main") -> np.ndarray:
        with self._busy:
            full = np.concatenate([self._mask, mask], axis=1)
            logits, = self._runner.call(self._arguments(ids, full, function), function)
            self._mask = full
            return logits.numpy()


def check_vocabulary(ids: np.ndarray, vocab: int) -> None:
    """An InputError naming the first of ``ids`` outside ``0..vocab - 1``, if any."""
    outside = ids[(ids < 0) | (ids >= vocab)]
    if outside.size:
        raise InputError(f"token id {int(outside[0])} is outside the vocabulary 0..{vocab - 1}")


def _nbytes(tensor: Any) -> int:
    return int(np.prod(tensor.shape)) * np.dtype(str(tensor.dtype)).itemsize
