"""``generate``: a session's prompt, then one token per step until each row ends, in the shape of
transformers' ``generate`` (its argument names, left-padded batches, its streamer protocol)."""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from relaxc.runtime.generation.sampling import Sampling, choose, resolved
from relaxc.runtime.generation.session import Session
from relaxc.support.errors import UserError


def generate(session: Session, input_ids: Any, attention_mask: Any = None, max_new_tokens: int | None = None,
             do_sample: bool | None = None, temperature: float | None = None, top_k: int | None = None,
             top_p: float | None = None, repetition_penalty: float | None = None,
             eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None, seed: int | None = None,
             streamer: Any = None, generation_config: str | os.PathLike | dict | None = None) -> np.ndarray:
    """The prompt and its continuation, int64 [batch, prompt + new]. ``session`` starts empty.

    Rows of different lengths come left-padded with ``attention_mask`` 0 on the padding, as
    transformers takes them. A row that draws an ``eos_token_id`` stops, and its later places hold
    ``pad_token_id`` (default: the first EOS id); generation ends when every row has stopped or after
    ``max_new_tokens`` (default: up to the artifact's ``max_length``). ``streamer`` gets ``put`` with
    the prompt, then each step's tokens, and ``end()`` (transformers' ``TextStreamer`` works as it is).
    A setting left out comes from ``generation_config`` (a checkpoint directory with its
    ``generation_config.json``, or the dict) where it has one, else transformers' default
    (``sampling.resolved``: greedy; sampled, top-k 50).
    """
    given = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                 top_p=top_p, repetition_penalty=repetition_penalty, eos_token_id=eos_token_id,
                 pad_token_id=pad_token_id)
    settings = resolved(given, generation_config)
    max_new_tokens, eos_token_id, pad_token_id = (settings.pop(k) for k in ("max_new_tokens", "eos_token_id",
                                                                             "pad_token_id"))
    sampling = Sampling(**{key: value for key, value in settings.items() if value is not None})
    ids = session.check_ids(input_ids)
    room = session.max_length - ids.shape[1]
    new = room if max_new_tokens is None else max_new_tokens
    if not isinstance(new, (int, np.integer)) or new < 1 or new > room:
        raise UserError(f"max_new_tokens must be 1..{room} (max_length={session.max_length} minus the "
                        f"{ids.shape[1]}-token prompt), not {max_new_tokens!r}")
    eos = [] if eos_token_id is None else [eos_token_id] if np.isscalar(eos_token_id) else list(eos_token_id)
    pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)
    rng = np.random.default_rng(seed)
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, np.int64)
    seen = np.zeros((ids.shape[0], session.vocab), bool)  # what the repetition penalty makes less likely
    for row, (row_ids, row_mask) in enumerate(zip(ids, mask)):
        seen[row, row_ids[row_mask > 0]] = True
    if streamer is not None:
        streamer.put(ids)
    logits = session.append(ids, mask)
    done = np.zeros(ids.shape[0], bool)
    tokens = []
    for index in range(new):
        token = np.where(done, pad, choose(logits, seen, sampling, rng))
        seen[np.arange(len(token)), token] |= ~done
        tokens.append(token)
        if streamer is not None:
            streamer.put(token)
        done |= np.isin(token, eos)
        if done.all() or index == new - 1:
            break
        logits = session.step(token)
    if streamer is not None:
        streamer.end()
    return np.concatenate([ids, np.stack(tokens, axis=1)], axis=1)
