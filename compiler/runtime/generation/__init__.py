"""Text generation over a decoder compiled with ``max_length`` (docs/generation.md): sessions that
keep the cache between calls (``session.py``), rows cached to lengths of their own for continuous
batching (``rows.py``), the choice of each next token (``sampling.py``) and
the ``generate`` loop (``loop.py``). Runtime only: a loaded artifact generates without the compile
side."""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm

from relaxc.runtime import weight_file
from relaxc.runtime.generation.loop import generate
from relaxc.runtime.generation.rows import Rows
from relaxc.runtime.generation.session import Session
from relaxc.support.errors import UserError


class Generates:
    """``session()`` and ``generate()`` for a runner whose ``decoder`` is set (a decoder compiled
    with ``max_length``: its ``report()["decoder"]``)."""

    decoder: dict | None = None
    weights: list | None = None  # a decoder's, lifted out of its programs (passes/weights.py)
    _device: Any = None
    _weight_argument: Any = None

    def session(self) -> Session:
        """A new, empty session: ``append(ids)``, ``step(token)``, ``reset()``. One per thread."""
        return Session(self, self._compiled_decoder())

    def rows(self, slots: int | None = None) -> Rows:
        """``slots`` rows (default ``max_batch``) each cached to its own length: ``prefill(slot, ids)``,
        ``step(slots, tokens)``, ``free(slot)`` (continuous batching: rows join and leave between steps)."""
        return Rows(self, self._compiled_decoder(), slots)

    def _compiled_decoder(self) -> dict:
        if self.decoder is None:
            raise UserError("this model was compiled without max_length: compile a decoder with past with "
                            "max_length=N to generate with it")
        return self.decoder

    def _refuse_single_steps(self) -> None:
        """A UserError for ``run`` on a decoder whose cache the program keeps in place."""
        if self.decoder is not None and "cache" in self.decoder:
            raise UserError("a decoder compiled with max_length keeps its cache in place: run it through "
                            "session() or generate(), or compile it without max_length to run single steps")

    def weight_argument(self) -> list:
        """The programs' last arguments: the weights as one tuple, where they take them (else none)."""
        if self.weights and self._weight_argument is None:
            self._weight_argument = weight_file.as_argument(self.weights)
        return [self._weight_argument] if self.weights else []

    def call_zeros(self, shape: tuple[int, ...], dtype: str) -> Any:
        """A tensor of zeros on the device ``call`` runs on: a session's cache."""
        return tvm.runtime.tensor(np.zeros(shape, dtype), self._device)

    def generate(self, input_ids: Any, attention_mask: Any = None, **settings: Any) -> np.ndarray:
        """``input_ids`` [batch, prompt] and its continuation, int64 [batch, prompt + new], in a
        session of its own. ``settings``: transformers' ``max_new_tokens``, ``do_sample``,
        ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, ``eos_token_id``,
        ``pad_token_id``, ``streamer``, ``seed``, and ``generation_config`` (a checkpoint's, for what the
        others leave out: ``relaxc.runtime.generation.loop.generate``)."""
        return generate(self.session(), input_ids, attention_mask, **settings)


__all__ = ["Generates", "Rows", "Session", "generate"]
