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


def distribution(logits: np.ndarray, sampling: Sampling) -> np.ndarray:
    """The probabilities [batch, vocab] a token is drawn from: temperature, top-k, top-p applied."""
    scores = logits.astype(np.float64) / sampling.temperature
    if 0 < sampling.top_k < scores.shape[-1]:
        kth = np.sort(scores, axis=-1)[:, -sampling.top_k][:, None]
        scores = np.where(scores < kth, -np.inf, scores)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if sampling.top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")
        ranked = np.take_along_axis(probs, order, axis=-1)
        before = np.cumsum(ranked, axis=-1) - ranked  # what the more probable tokens already hold
        keep = np.zeros_like(probs, dtype=bool)
        np.put_along_axis(keep, order, before < sampling.top_p, axis=-1)
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def choose(logits: np.ndarray, seen: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> np.ndarray:
    """The next token of each row (int64 [batch])."""
    logits = penalized(logits, seen, sampling.repetition_penalty)
    if not sampling.do_sample:
        return np.argmax(logits, axis=-1).astype(np.int64)
    cumulative = np.cumsum(distribution(logits, sampling), axis=-1)
    draws = rng.random(len(cumulative))[:, None] * cumulative[:, -1:]  # below the total: a token it may draw
    return (cumulative <= draws).sum(axis=-1).astype(np.int64)
