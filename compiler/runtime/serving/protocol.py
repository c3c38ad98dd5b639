"""OpenAI's API as the server speaks it: a request body checked into the settings of one generation,
the responses and stream chunks built in OpenAI's shapes, and errors in OpenAI's error body.

Taken: ``model``, ``prompt`` (a string, or token ids; one of either) or ``messages``, ``max_tokens``
(``max_completion_tokens`` for chat; default: what ``max_length`` leaves), ``temperature`` (0 to 2,
default 1; 0 is greedy), ``top_p``, ``seed``, ``stop`` (up to 4 strings), ``stream`` and
``stream_options.include_usage``; ``n`` 1 alone. What the server cannot honour (``logprobs``,
``echo``, penalties, ``n`` > 1, ``best_of``) is refused, never ignored; fields that change nothing in
a generation (``user``, ``metadata``) are.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from relaxc.runtime.generation.sampling import Sampling


class ApiError(Exception):
    """An error answered with ``status`` and OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Settings:
    """One request's generation, checked: ``max_tokens`` None until the prompt's length is known."""

    max_tokens: int | None
    sampling: Sampling
    seed: int | None
    stop: list[str]
    stream: bool
    include_usage: bool


UNSUPPORTED = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
               "frequency_penalty": (None, 0, 0.0), "presence_penalty": (None, 0, 0.0), "logit_bias": (None, {}),
               "suffix": (None, ""), "tools": (None, []), "response_format": (None, {"type": "text"})}


def settings(body: dict, chat: bool) -> Settings:
    """The generation ``body`` asks for; an ``ApiError`` (400) naming the first field that is wrong."""
    for name, allowed in UNSUPPORTED.items():
        if name in body and body[name] not in allowed:
            raise ApiError(400, f"{name} is not supported by this server", name, "unsupported_parameter")
    if body.get("n", 1) != 1:
        raise ApiError(400, "n must be 1: this server returns one choice per request", "n")
    limit = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, limit, int, low=1)
    temperature = _number(body, "temperature", float, low=0, high=2)
    top_p = _number(body, "top_p", float, low=0, high=1, low_open=True)
    seed = _number(body, "seed", int)
    temperature = 1.0 if temperature is None else temperature
    sampling = Sampling(do_sample=temperature > 0, temperature=temperature or 1.0, top_k=0,
                        top_p=1.0 if top_p is None else top_p)
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, "stop must be a string or a list of up to 4 strings", "stop")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    return Settings(max_tokens, sampling, seed, stop, stream, bool(options.get("include_usage")))


def _number(body: dict, name: str, kind: type, low: float | None = None, high: float | None = None,
            low_open: bool = False) -> Any:
    value = body.get(name)
    if value is None:
        return None
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not (whole or (kind is float and isinstance(value, float))):
        raise ApiError(400, f"{name} must be {'a whole number' if kind is int else 'a number'}, not {value!r}", name)
    too_low = low is not None and (value <= low if low_open else value < low)
    if too_low or (high is not None and value > high):
        bounds = f"{'above' if low_open else 'at least'} {low}" + (f" and at most {high}" if high is not None else "")
        raise ApiError(400, f"{name} must be {bounds}, not {value!r}", name)
    return kind(value)


def prompt_of(body: dict) -> str | list[int]:
    """A completion's prompt: text, or token ids (one prompt, as a list of one too)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise ApiError(400, "prompt must be one non-empty string or one non-empty list of token ids", "prompt")


def messages_of(body: dict) -> list[dict]:
    """A chat's messages, each ``{"role", "content"}`` with its text parts joined."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, f"messages[{index}] must be an object with a role", "messages")
        content = message.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise ApiError(400, f"messages[{index}].content: only text parts are supported", "messages")
            content = "".join(part["text"] for part in content)
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{index}].content must be text", "messages")
        checked.append({**message, "content": content})
    return checked


class Reply:
    """The responses of one request, completion or chat, in OpenAI's shapes."""

    def __init__(self, model: str, chat: bool, prompt_tokens: int) -> None:
        self.model, self.chat, self.prompt_tokens = model, chat, prompt_tokens
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def usage(self, completion_tokens: int) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": self.prompt_tokens + completion_tokens}

    def whole(self, text: str, finish_reason: str, completion_tokens: int) -> dict:
        """The response of a request not streamed."""
        choice = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        choice |= {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
        return self._head("chat.completion" if self.chat else "text_completion") | {
            "choices": [choice], "usage": self.usage(completion_tokens)}

    def chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False) -> dict:
        """A stream's chunk: ``text`` (None: none), the finish reason on the last."""
        if self.chat:
            delta = ({"role": "assistant"} if first else {}) | ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish_reason, "logprobs": None}
        return self._head("chat.completion.chunk" if self.chat else "text_completion") | {"choices": [choice]}

    def usage_chunk(self, completion_tokens: int) -> dict:
        """The last chunk of a stream with ``include_usage``: no choices, the usage."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return self._head(kind) | {"choices": [], "usage": self.usage(completion_tokens)}

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}
