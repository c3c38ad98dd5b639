"""Text in and out of a served decoder: a checkpoint's tokenizer and chat template, and each request's
output decoded as it grows, with its stop strings held back until they are ruled out.

The chat template is the checkpoint's own (``tokenizer_config.json``'s ``chat_template``), rendered
with jinja2 as transformers renders it (a sandbox, ``trim_blocks`` and ``lstrip_blocks``, the
``raise_exception`` function and a ``tojson`` filter), then encoded without special tokens added: the
template writes them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

from relaxc.runtime.generation.streaming import tokenizer as read_tokenizer
from relaxc.support.errors import UserError


class ChatTemplateMissing(UserError):
    """The checkpoint has no chat template: chat requests cannot be rendered (completions can)."""


@dataclass
class Text:
    """A checkpoint's tokenizer (``tokenizers.Tokenizer``), its chat template and special tokens, and
    the ids that end a generation (``generation_config.json``'s ``eos_token_id``, else the
    tokenizer's EOS token)."""

    tokenizer: Any
    chat_template: str | None
    special: dict[str, str]
    eos: frozenset[int]

    @classmethod
    def read(cls, directory: str) -> "Text":
        """The tokenizer files of a checkpoint ``directory`` (``tokenizer.json``, and
        ``tokenizer_config.json`` and ``generation_config.json`` where it has them)."""
        tokenizer = read_tokenizer(directory)
        config = _json(os.path.join(directory, "tokenizer_config.json"))
        special = {name: _content(config.get(f"{name}_token")) for name in ("bos", "eos", "unk", "pad")}
        special = {name: token for name, token in special.items() if token}
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        eos = _json(os.path.join(directory, "generation_config.json")).get("eos_token_id")
        if eos is None and "eos" in special:
            eos = tokenizer.token_to_id(special["eos"])
        ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        return cls(tokenizer, template, special, frozenset(ids))

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=special_tokens).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def chat(self, messages: list[dict]) -> list[int]:
        """``messages`` rendered by the chat template, ready for the assistant's turn, as token ids."""
        if not self.chat_template:
            raise ChatTemplateMissing("this tokenizer has no chat_template (tokenizer_config.json): chat needs one; "
                                      "/v1/completions takes plain prompts")
        return self.encode(render(self.chat_template, messages, self.special), special_tokens=False)


def render(template: str, messages: list[dict], special: dict[str, str]) -> str:
    """``template`` rendered as transformers' ``apply_chat_template`` renders it."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise UserError(f"the chat template refused these messages: {message}")

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    environment.globals["raise_exception"] = raise_exception
    try:
        compiled = environment.from_string(template)
    except jinja2.TemplateError as err:
        raise UserError(f"the tokenizer's chat_template does not parse: {err}") from None
    return compiled.render(messages=messages, add_generation_prompt=True,
                           **{f"{name}_token": token for name, token in special.items()})


class Output:
    """One request's output text as its tokens come: ``add(token)`` returns the text that may be sent
    now; text that could begin a stop string is held until it does not, and where a stop string
    appears the text ends before it (``stopped``), the string itself never sent."""

    def __init__(self, text: Text, stop: Sequence[str]) -> None:
        self.text, self.stop = text, [s for s in stop if s]
        self.tokens: list[int] = []
        self.sent = ""
        self.stopped = False

    def add(self, token: int) -> str:
        self.tokens.append(token)
        decoded = self.text.decode(self.tokens)
        if decoded.endswith("\ufffd"):  # a character cut between tokens: wait for the rest
            return ""
        pending = decoded[len(self.sent):]
        found = [i for i in (pending.find(s) for s in self.stop) if i >= 0]
        if found:
            self.stopped = True
            return self._send(pending[:min(found)])
        held = max((n for s in self.stop for n in range(len(s) - 1, 0, -1) if pending.endswith(s[:n])), default=0)
        return self._send(pending[:len(pending) - held])

    def flush(self) -> str:
        """What is held back, at the end (a stop string's beginning that never completed)."""
        if self.stopped:
            return ""
        return self._send(self.text.decode(self.tokens)[len(self.sent):])

    def _send(self, delta: str) -> str:
        self.sent += delta
        return delta


def _json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {path}: {err}") from None


def _content(token: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    return token.get("content") if isinstance(token, dict) else token
