"""The HTTP side: a FastAPI application over a ``Scheduler``, OpenAI's routes, streams as server-sent
events (``data: {chunk}`` lines ending with ``data: [DONE]``), and every failure as OpenAI's error
body with its status, the server serving on. uvicorn runs it (``serve``)."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import numpy as np
from fastapi import FastAPI, Request  # a module level name: FastAPI reads the routes' annotations by it
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from relaxc.runtime.generation.session import check_vocabulary
from relaxc.runtime.serving.protocol import ApiError, Reply, messages_of, prompt_of, settings
from relaxc.runtime.serving.scheduler import Job, QueueFull, Scheduler
from relaxc.runtime.serving.text import Text
from relaxc.support.errors import InputError, UserError

DISCONNECT_POLL = 0.25  # seconds between checks that the client of a request not streamed is still there


def create_app(art: Any, text: Text, name: str, slots: int | None = None, max_queue: int = 64,
               prefill_chunk: int | None = None) -> Any:
    """The application serving ``art`` (a decoder compiled with ``max_length``) as model ``name``;
    its scheduler starts with the application and stops with it."""
    chunk = {} if prefill_chunk is None else {"prefill_chunk": prefill_chunk}
    rows = art.rows(slots)  # refused here, before the server starts, where the decoder cannot serve
    state: dict[str, Scheduler] = {}

    @asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        state["scheduler"] = Scheduler(rows, text, max_queue, **chunk)
        yield
        state.pop("scheduler").close()

    app = FastAPI(title="relaxc", lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, err: ApiError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, err: RequestValidationError) -> JSONResponse:
        return await api_error(_request, ApiError(400, f"the request is not valid: {err.errors()[0].get('msg')}"))

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, err: HTTPException) -> JSONResponse:
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        return await api_error(_request, ApiError(err.status_code, str(err.detail), kind=kind))

    @app.get("/health")
    async def health() -> dict:
        scheduler = state["scheduler"]
        return {"status": "ok", "slots": scheduler.rows.slots, "busy": scheduler.busy}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [_model(name)]}

    @app.get("/v1/models/{model}")
    async def model(model: str) -> dict:
        _check_model(model, name)
        return _model(name)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await _body(request)
        _check_model(body.get("model"), name)
        prompt = prompt_of(body)
        ids = text.encode(prompt) if isinstance(prompt, str) else prompt
        return await _respond(request, body, ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await _body(request)
        _check_model(body.get("model"), name)
        try:
            ids = text.chat(messages_of(body))
        except UserError as err:
            raise ApiError(400, str(err), "messages") from None
        return await _respond(request, body, ids, chat=True)

    async def _respond(request: Request, body: dict, ids: list[int], chat: bool) -> Any:
        scheduler = state["scheduler"]
        asked = settings(body, chat)
        max_tokens = _room(asked.max_tokens, ids, scheduler)
        loop, events = asyncio.get_running_loop(), asyncio.Queue()

        def emit(kind: str, value: Any) -> None:  # from the scheduler's thread
            try:
                loop.call_soon_threadsafe(events.put_nowait, (kind, value))
            except RuntimeError:  # the loop closed: the server is gone
                pass

        job = Job(ids, max_tokens, asked.sampling, emit, asked.seed, asked.stop)
        try:
            scheduler.submit(job)
        except QueueFull as err:
            raise ApiError(503, str(err), code="server_busy", kind="server_error") from None
        reply = Reply(name, chat, len(ids))
        if asked.stream:
            return StreamingResponse(_stream(scheduler, job, events, reply, asked.include_usage),
                                     media_type="text/event-stream")
        parts = []
        while True:
            try:
                kind, value = await asyncio.wait_for(events.get(), DISCONNECT_POLL)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    scheduler.cancel(job)
                    return JSONResponse({}, status_code=499)
                continue
            if kind == "text":
                parts.append(value)
            elif kind == "end":
                return reply.whole("".join(parts), *value)
            else:
                raise ApiError(500, value, kind="server_error")

    return app


async def _stream(scheduler: Scheduler, job: Job, events: asyncio.Queue, reply: Reply,
                  include_usage: bool) -> AsyncIterator[str]:
    """The server-sent events of ``job``; a client that goes away cancels it (``finally``)."""
    try:
        if reply.chat:
            yield _event(reply.chunk("", first=True))
        while True:
            kind, value = await events.get()
            if kind == "text":
                yield _event(reply.chunk(value))
            elif kind == "end":
                reason, completion_tokens = value
                yield _event(reply.chunk(None, reason))
                if include_usage:
                    yield _event(reply.usage_chunk(completion_tokens))
                break
            else:
                yield _event(ApiError(500, value, kind="server_error").body())
                break
        yield "data: [DONE]\n\n"
    finally:
        scheduler.cancel(job)  # nothing where it ended; else its row leaves at the next step


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _body(request: Any) -> dict:
    try:
        body = json.loads(await request.body())
    except ValueError as err:
        raise ApiError(400, f"the body is not JSON: {err}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def _check_model(asked: Any, name: str) -> None:
    if asked != name:
        raise ApiError(404, f"the model {asked!r} does not exist: this server serves {name!r}", "model",
                       "model_not_found", "not_found_error")


def _model(name: str) -> dict:
    return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "relaxc"}


def _room(max_tokens: int | None, ids: list[int], scheduler: Scheduler) -> int:
    """The tokens a request may add: ``max_tokens``, checked against what ``max_length`` leaves after its
    prompt (all of that where not given); token ids checked against the vocabulary."""
    rows = scheduler.rows
    try:
        check_vocabulary(np.asarray(ids), rows.vocab)
    except InputError as err:
        raise ApiError(400, str(err), "prompt") from None
    room = rows.max_length - len(ids)
    if room < 1:
        raise ApiError(400, f"the prompt is {len(ids)} tokens: max_length={rows.max_length} leaves no room for "
                            "a completion", "prompt", "context_length_exceeded")
    if max_tokens is not None and max_tokens > room:
        raise ApiError(400, f"max_tokens={max_tokens} is more than the {room} that max_length={rows.max_length} "
                            f"leaves after the {len(ids)}-token prompt", "max_tokens", "context_length_exceeded")
    return room if max_tokens is None else max_tokens
