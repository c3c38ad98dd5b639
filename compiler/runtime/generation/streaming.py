"""What ``relaxc generate`` prints as it generates: the tokens (ids, or text through a tokenizer) as
they come, then prefill and decode speed. A streamer in transformers' protocol (``put``, ``end``)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

import numpy as np

from relaxc.support.errors import UserError


def tokenizer(directory: str) -> Any:
    """The tokenizer of a transformers checkpoint directory (its ``tokenizer.json``), read with the
    ``tokenizers`` package; never downloaded."""
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.isfile(path):
        raise UserError(f"no tokenizer.json in {directory}: give a checkpoint directory that has one")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UserError("text prompts need the tokenizers package: pip install 'relaxc[text]'") from None
    return Tokenizer.from_file(path)


class Printer:
    """Prints each new token as it comes (decoded by ``decode``, else as ids) and times the steps:
    the prompt's (prefill) until the first token, the rest one token each (decode)."""

    def __init__(self, decode: Any = None, out: TextIO = sys.stdout) -> None:
        self.decode, self.out = decode, out
        self.times: list[float] = []
        self.prompt = 0
        self.tokens: list[int] = []
        self.shown = ""

    def put(self, value: Any) -> None:
        value = np.asarray(value)
        if not self.times:  # the prompt comes first
            self.prompt = value.shape[-1]
            self.times.append(time.perf_counter())
            return
        self.times.append(time.perf_counter())
        self.tokens.append(int(value.reshape(-1)[0]))
        if self.decode is None:
            self.out.write(f"{self.tokens[-1]} ")
        else:  # the whole text again, printed from where it was: a token may change what came before
            text = self.decode(self.tokens)
            self.out.write(text[len(self.shown):] if text.startswith(self.shown) else f"\n{text}")
            self.shown = text
        self.out.flush()

    def end(self) -> None:
        self.out.write("\n")

    def speeds(self) -> str:
        """Prefill and decode tokens per second."""
        prefill = self.times[1] - self.times[0] if len(self.times) > 1 else float("nan")
        decode = (self.times[-1] - self.times[1]) / (len(self.times) - 2) if len(self.times) > 2 else float("nan")
        return (f"prefill: {self.prompt} tokens in {prefill * 1e3:.1f} ms ({self.prompt / prefill:.1f} tokens/s); "
                f"decode: {len(self.tokens)} tokens, {decode * 1e3:.2f} ms each ({1 / decode:.1f} tokens/s)")
