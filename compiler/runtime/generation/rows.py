"""Rows cached to lengths of their own over one cache: what a server's continuous batching decodes.

A ``Session`` keeps every row at one length, the shorter left-padded. ``Rows`` gives each of its
slots a length of its own: ``prefill(slot, ids)`` runs a prompt, or a chunk of one, through ``main``
at batch 1 on that slot's part of the cache (a view, nothing copied); ``step(slots, tokens)`` runs one
token for each of the given slots together through ``decode``, each row writing its keys and values
at its own length (``write_at``, ``passes/kv_cache.py``) under a mask that reads its own columns alone.
A row's logits are then the bits it gets alone at batch 1: each kernel reduces a row in the same order
at any batch, and the columns of longer rows that a shorter row's step spans are masked to
probabilities of exactly 0, which add zeros to its sums.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np
import tvm
import tvm_ffi

from relaxc.runtime.generation.session import check_vocabulary
from relaxc.support.cache_layout import CacheLayout
from relaxc.support.errors import InputError, UserError


class Rows:
    """``slots`` rows (default ``max_batch``) over ``runner``, a decoder compiled with ``max_length``
    (``decoder``: its ``report()["decoder"]``), each cached to its own length. One thread at a time."""

    def __init__(self, runner: Any, decoder: dict, slots: int | None = None) -> None:
        if runner.subgraphs:
            raise UserError("generation runs relaxc's program alone: compile the decoder with backends='relaxc'")
        self.slots = decoder["max_batch"] if slots is None else slots
        if not 1 <= self.slots <= decoder["max_batch"]:
            raise UserError(f"slots must be 1..max_batch={decoder['max_batch']}, not {slots}")
        if self.slots > 1 and (not decoder.get("positions") or decoder.get("cache_position")):
            raise UserError("rows of different lengths need a decoder that reads position_ids and no cache_position "
                            "(each row's positions are its own); this export counts them from the cache: one row "
                            "at a time only (slots=1, relaxc serve --max-batch 1)")
        if runner._device is None or runner._device.dlpack_device_type() != tvm.cpu().dlpack_device_type():
            raise UserError("rows of their own lengths run on CPU artifacts (each slot's cache is a host view)")
        self._runner, self.decoder = runner, decoder
        self.max_length, self.vocab = decoder["max_length"], decoder["vocab"]
        self.layout = CacheLayout.from_json(decoder.get("cache"))
        self._inputs = [name for name, _, _ in runner.inputs]
        self._caches = {past: runner.call_zeros(self.layout.shape(past, self.slots), self.layout.dtype)
                        for past in self.layout.pasts}
        self._host = {past: np.from_dlpack(cache) for past, cache in self._caches.items()}  # the same memory
        self.lengths = np.zeros(self.slots, np.int64)  # tokens cached per slot
        self._busy = threading.Lock()

    def free(self, slot: int) -> None:
        """Empty ``slot``: its next ``prefill`` starts a new conversation there."""
        self.lengths[slot] = 0

    def prefill(self, slot: int, input_ids: Any) -> np.ndarray:
        """Run ``input_ids`` (1-D) after what ``slot`` holds; the logits of its last position [vocab]."""
        ids = np.asarray(input_ids)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise InputError(f"a row's input_ids are whole numbers [tokens], at least one; got {ids.dtype} {ids.shape}")
        check_vocabulary(ids, self.vocab)
        length = int(self.lengths[slot])
        self._room(slot, ids.size)
        feeds = {"input_ids": ids[None].astype(np.int64), "attention_mask": np.ones((1, length + ids.size), np.int64),
                 "position_ids": np.arange(length, length + ids.size, dtype=np.int64)[None],
                 "cache_position": np.arange(length, length + ids.size, dtype=np.int64)}  # fed where taken
        feeds |= {past: tvm.runtime.from_dlpack(host[slot:slot + 1]) for past, host in self._host.items()}
        logits = self._call(feeds, [tvm_ffi.Shape([length])], "main")
        self.lengths[slot] += ids.size
        return logits[0, -1]

    def step(self, slots: Sequence[int], tokens: Any) -> np.ndarray:
        """Run ``tokens[i]`` after what ``slots[i]`` holds, all in one step; their next logits
        [len(slots), vocab]. The other slots below the highest given are carried along idle."""
        slots = list(slots)
        ids = np.asarray(tokens, np.int64).reshape(-1)
        if not slots or len(set(slots)) != len(slots) or ids.size != len(slots):
            raise InputError(f"step takes one token for each of distinct slots: {len(slots)} slots, {ids.size} tokens")
        check_vocabulary(ids, self.vocab)
        for slot in slots:
            self._room(slot, 1)
        rows = max(slots) + 1
        feed = np.zeros(rows, np.int64)
        feed[slots] = ids
        # an idle row writes its token's keys at its next free column: overwritten by its own next
        # write, and past the cache's last row never (a full row is finished)
        at = np.minimum(self.lengths[:rows], self.layout.rows - 1)
        past = int(at.max())
        feeds = {"input_ids": feed[:, None], "attention_mask": (np.arange(past + 1) <= at[:, None]).astype(np.int64),
                 "position_ids": at[:, None].copy(), "cache_position": at[:1].copy()}  # one row where it is taken
        feeds |= {past_name: tvm.runtime.from_dlpack(host[:rows]) for past_name, host in self._host.items()}
        logits = self._call(feeds, [tvm_ffi.Shape([past]), at], "decode")
        self.lengths[slots] += 1
        return logits[slots, -1]

    def _call(self, feeds: dict, lengths: list, function: str) -> np.ndarray:
        with self._busy:
            arguments = [feeds[name] for name in self._inputs] + lengths + self._runner.weight_argument()
            logits, = self._runner.call(arguments, function)
            return logits.numpy()

    def _room(self, slot: int, tokens: int) -> None:
        if not 0 <= slot < self.slots:
            raise InputError(f"slot {slot} is outside 0..{self.slots - 1}")
        if self.lengths[slot] + tokens > self.max_length:
            raise UserError(f"slot {slot} holds {self.lengths[slot]} tokens; {tokens} more is over "
                            f"max_length={self.max_length}")
