"""The CLI's commands that turn a decoder into text: ``relaxc generate`` (one prompt, streamed to the
terminal) and ``relaxc serve`` (an OpenAI-compatible server, docs/serving.md). Each takes an ONNX
decoder, compiled at start-up for ``--max-length``, or an exported ``.so`` loaded as it is."""

from __future__ import annotations

import argparse
import os

import numpy as np

from relaxc.support.errors import UserError

SERVE_BATCH = 4  # rows an .onnx decoder is compiled for by `relaxc serve`: a step of 4 costs about one of 1


def cmd_generate(args: argparse.Namespace) -> int:
    from relaxc.runtime.generation.streaming import Printer, tokenizer

    if args.prompt is not None and not args.tokenizer:
        raise UserError("--prompt TEXT needs --tokenizer DIR (a checkpoint directory with tokenizer.json); "
                        "or give token ids with --prompt-ids")
    words = tokenizer(args.tokenizer) if args.tokenizer else None
    ids = np.array([args.prompt_ids if args.prompt is None else words.encode(args.prompt).ids], np.int64)
    runner = _decoder(args)
    printer = Printer(words.decode if words else None)
    runner.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=args.do_sample or None,
                    temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                    repetition_penalty=args.repetition_penalty, eos_token_id=args.eos_token_id, seed=args.seed,
                    streamer=printer, generation_config=args.tokenizer)
    print(printer.speeds())
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from relaxc.runtime import serving

    if not args.model.endswith(".so") and args.max_batch is None:
        args.max_batch = SERVE_BATCH
    art = _decoder(args)
    serving.serve(art, args.tokenizer, args.host, args.port, name=args.served_model_name or _name(args.model),
                  slots=args.max_batch, max_queue=args.max_queue, prefill_chunk=args.prefill_chunk)
    return 0


def _decoder(args: argparse.Namespace):
    """The decoder ``args.model`` names: an exported ``.so`` loaded, else compiled for ``--max-length``."""
    import relaxc
    from relaxc import cli

    if args.model.endswith(".so"):
        return relaxc.load(args.model)
    if args.max_length is None:
        raise UserError("--max-length N: the tokens a sequence may hold, prompt included, to compile the decoder for")
    return cli._compile(args)


def _name(model: str) -> str:
    """A model's name as served where ``--served-model-name`` gives none: its file's, without suffix."""
    return os.path.splitext(os.path.basename(model))[0].split(":")[-1]


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """``generate`` and ``serve`` under ``sub``, with the model and compile options of ``relaxc compile``."""
    from relaxc import cli
    from relaxc.runtime.serving.scheduler import PREFILL_CHUNK

    p = sub.add_parser("generate", parents=[common], help="generate from a decoder with past (.onnx or an "
                       "exported .so), streaming the tokens, then prefill and decode speed (docs/generation.md)")
    cli._add_model_args(p)
    cli._add_decoder_arg(p, all_logits=False)  # generation reads the last position alone
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", type=lambda text: [int(v) for v in text.split(",")], metavar="ID,ID,...",
                        help="the prompt as token ids")
    prompt.add_argument("--prompt", metavar="TEXT", help="the prompt as text (with --tokenizer)")
    p.add_argument("--tokenizer", metavar="DIR", help="a checkpoint directory with tokenizer.json: text in and out "
                   "(needs relaxc[text]; never downloaded); its generation_config.json, if any, sets what the "
                   "options below leave out")
    p.add_argument("--max-new-tokens", type=int, metavar="N", help="tokens to generate (default: up to --max-length)")
    p.add_argument("--do-sample", action="store_true", help="draw each token instead of taking the most likely")
    p.add_argument("--temperature", type=float, help="with --do-sample (default 1.0)")
    p.add_argument("--top-k", type=int, help="with --do-sample: the k most likely only, 0 for all (default 50)")
    p.add_argument("--top-p", type=float, help="with --do-sample: the most likely up to p (default 1.0)")
    p.add_argument("--repetition-penalty", type=float, help="tokens seen made less likely (default 1.0)")
    p.add_argument("--eos-token-id", type=int, help="stop at this token")
    p.add_argument("--seed", type=int, help="seed of --do-sample's draws")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("serve", parents=[common], help="serve a decoder with past (.onnx or an exported .so) "
                       "over OpenAI's HTTP API, requests batched as they come (docs/serving.md)")
    cli._add_model_args(p)
    cli._add_decoder_arg(p, all_logits=False)
    p.add_argument("--tokenizer", metavar="DIR", required=True, help="a checkpoint directory with tokenizer.json "
                   "(and tokenizer_config.json's chat_template for chat)")
    p.add_argument("--max-batch", type=int, metavar="N", help="requests decoded together (compiled for; default: "
                   f"the .so's max_batch, {SERVE_BATCH} for an .onnx)")
    p.add_argument("--max-queue", type=int, default=64, metavar="N",
                   help="requests that may wait for a free row; more are answered 503 (default 64)")
    p.add_argument("--prefill-chunk", type=int, metavar="N", help="prompt tokens prefilled between two decode "
                   f"steps (default {PREFILL_CHUNK})")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--served-model-name", metavar="NAME", help="the model's name in the API (default: the file's)")
    p.set_defaults(func=cmd_serve)
