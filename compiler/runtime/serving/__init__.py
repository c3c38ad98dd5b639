"""An OpenAI-compatible server over a decoder compiled with ``max_length`` (docs/serving.md): the
HTTP side on FastAPI and uvicorn (``routes.py``), continuous batching over rows cached to lengths of
their own (``scheduler.py``), OpenAI's request and response shapes (``protocol.py``) and the
checkpoint's tokenizer and chat template (``text.py``). Runtime only: a loaded artifact serves
without the compile side; FastAPI, uvicorn and jinja2 come with ``pip install 'relaxc[serve]'``."""

from __future__ import annotations

from typing import Any

from relaxc.runtime.serving.text import Text
from relaxc.support.errors import UserError

GRACE_SECONDS = 5  # on Ctrl-C, streams in flight get this long to end before they are cancelled


def app(art: Any, tokenizer: str, name: str = "relaxc", slots: int | None = None, max_queue: int = 64,
        prefill_chunk: int | None = None) -> Any:
    """The ASGI application serving ``art`` as model ``name`` with the tokenizer of the checkpoint
    directory ``tokenizer``: ``slots`` rows decode together (default the artifact's ``max_batch``),
    ``max_queue`` requests wait for one (503 beyond), a prompt prefills ``prefill_chunk`` tokens a turn."""
    _need("fastapi", "jinja2")
    from relaxc.runtime.serving.routes import create_app

    if getattr(art, "decoder", None) is None:
        raise UserError("serving needs a decoder compiled with max_length (relaxc serve MODEL --max-length N)")
    return create_app(art, Text.read(tokenizer), name, slots, max_queue, prefill_chunk)


def serve(art: Any, tokenizer: str, host: str = "127.0.0.1", port: int = 8000, **options: Any) -> None:
    """Serve ``art`` over HTTP until interrupted (``app``'s ``options``); Ctrl-C lets streams in
    flight end for ``GRACE_SECONDS``, then cancels them."""
    _need("uvicorn")
    import uvicorn

    uvicorn.run(app(art, tokenizer, **options), host=host, port=port, timeout_graceful_shutdown=GRACE_SECONDS,
                log_level="info")


def _need(*modules: str) -> None:
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"serving needs {', '.join(missing)}: pip install 'relaxc[serve]'")


__all__ = ["app", "serve"]
