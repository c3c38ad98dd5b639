"""Choosing the next token from a step's logits: greedy, or drawn with temperature, top-k, top-p and a
repetition penalty, as transformers' ``generate`` does, from a seeded generator.

The order is transformers': the repetition penalty adjusts the logits (greedy decoding too), then
temperature scales them, top-k keeps the k largest, top-p keeps the smallest set of the most
probable tokens whose probabilities sum to at least p (always one), and the token is drawn from
what is left, renormalised.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from relaxc.support.errors import UserError


@dataclass(frozen=True)
class Sampling:
    """How a token is chosen (transformers' argument names and defaults)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50  # 0: no limit
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise UserError(f"temperature must be positive, not {self.temperature!r}")
        if not (isinstance(self.top_k, (int, np.integer)) and self.top_k >= 0):
            raise UserError(f"top_k must be a whole number, 0 for no limit, not {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top_p must be in (0, 1], not {self.top_p!r}")
        if not self.repetition_penalty > 0:
            raise UserError(f"repetition_penalty must be positive, not {self.repetition_penalty!r}")


SETTINGS = ("max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "eos_token_id",
            "pad_token_id")  # what a generation_config.json may set, as transformers' GenerationConfig names it


def resolved(given: dict[str, Any], config: str | os.PathLike | dict | None) -> dict[str, Any]:
    """``given`` (``generate``'s settings, None where the caller gave none) completed as transformers'
    ``GenerationConfig`` completes them: from ``config`` (a checkpoint directory and its
    ``generation_config.json`` if it has one, the file, or its dict), then transformers' defaults
    (``Sampling``'s; ``top_k`` 50). A setting the caller gives wins over the config."""
    if config is not None and not isinstance(config, dict):
        path = os.fspath(config)
        checkpoint = os.path.isdir(path)
        path = os.path.join(path, "generation_config.json") if checkpoint else path
        config = None if checkpoint and not os.path.exists(path) else _read_json(path)  # a checkpoint may have none
    return {key: (config or {}).get(key) if given.get(key) is None else given[key] for key in SETTINGS}


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read the generation config {path}: {err}") from None


def penalized(logits: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """``logits`` [batch, vocab] with each row's ``seen`` tokens (a boolean mask) made less likely:
    a positive logit divided by ``penalty``, a negative one multiplied (transformers' rule)."""
    if penalty == 1.0:
        return logits
    scaled = np.where(logits > 0, logits / penalty, logits * penalty)
    return np.where(seen, scaled, logits)


NUCLEUS = 1024  # the most probable tokens top-p ranks first: all of the vocabulary only where they hold less than p


def distribution(logits: np.ndarray, sampling: Sampling) -> np.ndarray:
    """The probabilities [batch, vocab] a token is drawn from: temperature, top-k, top-p applied.
    Neither sorts the vocabulary's ids: top-k partitions it, top-p sorts the probabilities of its
    likeliest tokens (``_nucleus``); both keep the tokens a stable sort of the ids keeps. A row of
    32,000 on Zen 4: 0.7 ms with top-k 50 (1.7 sorted), 0.9-2.2 ms with top-p 0.9 (2.5-3.9 sorted),
    beside a 125 M decoder's 14 ms step."""
    scores = logits.astype(np.float64) / sampling.temperature
    vocab = scores.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = np.partition(scores, vocab - sampling.top_k, axis=-1)[:, vocab - sampling.top_k][:, None]
        scores = np.where(scores < kth, -np.inf, scores)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if sampling.top_p < 1.0:
        probs = np.where(np.stack([_nucleus(row, sampling.top_p) for row in probs]), probs, 0.0)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def _nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """The tokens top-p keeps of one row: the fewest most probable (ties in id order) holding ``top_p``,
    those whose more probable tokens hold less than it. Sorts probabilities, not ids: of the
    ``NUCLEUS`` most probable where they hold ``top_p``, else of every token with any."""
    likely = probs[probs > 0]  # after top-k, often a few: partitioning thousands of equal zeros is slow
    if likely.size > NUCLEUS:
        first = likely[likely >= np.partition(likely, likely.size - NUCLEUS)[likely.size - NUCLEUS]]
        likely = first if first.sum() >= top_p else likely  # else the rest may hold part of the nucleus
    ranked = np.sort(likely)[::-1]
    before = np.cumsum(ranked) - ranked  # what the more probable tokens already hold
    kept = int(np.count_nonzero(before < top_p))
    last = ranked[kept - 1]  # the least probable kept: of the tokens this probable, the first in id order
    keep = probs > last
    keep[np.flatnonzero(probs == last)[:kept - int(keep.sum())]] = True
    return keep


def choose(logits: np.ndarray, seen: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> np.ndarray:
    """The next token of each row (int64 [batch])."""
    logits = penalized(logits, seen, sampling.repetition_penalty)
    if not sampling.do_sample:
        return np.argmax(logits, axis=-1).astype(np.int64)
    cumulative = np.cumsum(distribution(logits, sampling), axis=-1)
    draws = rng.random(len(cumulative))[:, None] * cumulative[:, -1:]  # below the total: a token it may draw
    return (cumulative <= draws).sum(axis=-1).astype(np.int64)
