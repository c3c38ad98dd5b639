"""Serving: concurrent clients through the official ``openai`` client against ``relaxc serve``.

    .venv/bin/python -m relaxc.benchmarks.serving [SPEC] [--clients 1 4 8] [--prompt 32] [--tokens 64]
        [--openvino-python ov/bin/python]

The decoder (default ``zoo:llama_125m_past``, Llama-class, 125 M parameters, random weights) is compiled
for ``max_batch`` 8 and exported; ``relaxc serve`` runs it in a process of its own (2 threads unless
``--threads``) with a stand-in byte-level tokenizer. For each number of clients, all start at once with
prompts of their own (``--prompt`` tokens), each asking ``--tokens`` greedy tokens, streamed: the median
over ``--repeat`` rounds of the time to first token, of each stream's tokens per second after its first
(decode), of their sum (all streams' decode together), and of every token over the time from the
start to the last one (prefills included). Then a request that arrives while 3 others decode: its time
to first token against its prefill alone plus 2 decode steps. Then the same requests given together to
relaxc's scheduler in this process (no HTTP, no client process on the cores), and with
``--openvino-python`` OpenVINO GenAI's ``ContinuousBatchingPipeline`` on a checkpoint of the same
architecture in its side virtualenv (``openvino_serving.py``, which checks its tokens against
transformers'), timed the same way, a round of each in turn; their ratio is the median of the rounds'.
Every text a client gets is checked against what the same artifact's ``generate`` gives its prompt
alone (a number of a program that answers wrong is not a result). Prints a table with the CPU and
target named.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Sequence

import numpy as np
import onnx

from relaxc.benchmarks import stand_in_tokenizer
from relaxc.benchmarks.bench import this_cpu
from relaxc.frontend import models

SPEC, SLOTS, EOS = "zoo:llama_125m_past", 8, 256


class Served:
    """``relaxc serve`` of an exported decoder in a process of its own."""

    def __init__(self, library: str, tokenizer: str, threads: int) -> None:
        import openai

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        command = [sys.executable, "-m", "relaxc", "serve", library, "--tokenizer", tokenizer, "--port", str(port),
                   "--served-model-name", "bench"]
        self.process = subprocess.Popen(command, env={**os.environ, "TVM_NUM_THREADS": str(threads)},
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
        for _ in range(1200):
            try:
                self.client.models.list()
                return
            except openai.APIConnectionError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"relaxc serve ended: {self.process.stderr.read()[-2000:]}") from None
                time.sleep(0.1)
        raise RuntimeError("relaxc serve did not answer in 2 minutes")

    def stream(self, prompt: list[int], tokens: int, started: float, out: dict) -> None:
        """One streamed greedy request: its text, and the time of each chunk after ``started``."""
        times, parts = out.setdefault("times", []), []  # the times as they come: a caller may watch
        for chunk in self.client.completions.create(model="bench", prompt=prompt, max_tokens=tokens, temperature=0,
                                                    stream=True):
            times.append(time.perf_counter() - started)
            parts.append(chunk.choices[0].text if chunk.choices else "")
        out["text"] = "".join(parts)

    def close(self) -> None:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(60)


def clients_at_once(served: Served, prompts: list[list[int]], tokens: int) -> list[dict]:
    """Every prompt's stream, all started together."""
    results = [{} for _ in prompts]
    started = time.perf_counter()
    threads = [threading.Thread(target=served.stream, args=(p, tokens, started, r)) for p, r in zip(prompts, results)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def rates(results: list[dict]) -> tuple[float, float, float, float]:
    """Median time to first token (ms); median tokens/s per stream after its first; their sum, the
    decode tokens/s of all streams together; and every token over the time from the start to the last."""
    first = statistics.median(r["times"][0] for r in results) * 1e3
    streams = [(len(r["times"]) - 1) / (r["times"][-1] - r["times"][0]) for r in results]
    end_to_end = sum(len(r["times"]) for r in results) / max(r["times"][-1] for r in results)
    return first, statistics.median(streams), sum(streams), end_to_end


def in_process(art, text, prompts: list[list[int]], tokens: int) -> tuple[float, list[str]]:
    """Tokens/s of ``prompts`` given together to relaxc's scheduler in this process (no HTTP, no client),
    from the start to the last token, and each prompt's text."""
    from relaxc.runtime.generation.sampling import Sampling
    from relaxc.runtime.serving.scheduler import Job, Scheduler

    scheduler = Scheduler(art.rows(len(prompts)), text)
    texts, ended = [[] for _ in prompts], threading.Semaphore(0)

    def collect(index: int):
        def emit(kind: str, value: object) -> None:
            if kind == "text":
                texts[index].append(value)
            else:
                ended.release()
        return emit

    started = time.perf_counter()
    for i, prompt in enumerate(prompts):
        scheduler.submit(Job(prompt, tokens, Sampling(), collect(i)))
    for _ in prompts:
        ended.acquire()
    elapsed = time.perf_counter() - started
    scheduler.close()
    return len(prompts) * tokens / elapsed, ["".join(parts) for parts in texts]


def arriving_under_load(served: Served, prompts: list[list[int]], tokens: int) -> tuple[float, float, float]:
    """(time to first token of a request that arrives while 3 others decode, its time to first token
    alone, the 3 others' milliseconds per step then), in ms."""
    alone: dict = {}
    served.stream(prompts[3], 1, time.perf_counter(), alone)
    busy = [{} for _ in range(3)]
    started = time.perf_counter()
    threads = [threading.Thread(target=served.stream, args=(p, tokens, started, r)) for p, r in zip(prompts, busy)]
    for thread in threads:
        thread.start()
    while min(len(r.get("times", [])) for r in busy) < 8:  # all 3 well into decoding
        time.sleep(0.005)
    late: dict = {}
    arrived = time.perf_counter()
    served.stream(prompts[3], 1, arrived, late)
    for thread in threads:
        thread.join()
    step = statistics.median(np.diff(busy[0]["times"])) * 1e3
    return late["times"][0] * 1e3, alone["times"][0] * 1e3, step


def openvino(python: str, folder: str, tokenizer: str, vocab: int, clients: Sequence[int], prompt: int, tokens: int,
             repeat: int, threads: int) -> dict[int, float]:
    """OpenVINO GenAI's continuous batching on the same architecture, in its side virtualenv's ``python``
    (``openvino_serving.py``): tokens/s end to end per number of clients."""
    import json

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openvino_serving.py")
    command = [python, script, "--out", os.path.join(folder, "openvino"), "--tokenizer", tokenizer, "--vocab", str(vocab),
               "--clients", *map(str, clients), "--prompt", str(prompt), "--tokens", str(tokens),
               "--repeat", str(repeat), "--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"OpenVINO GenAI's run failed: {done.stderr[-3000:]}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])["tokens_per_second_end_to_end"]
    return {int(n): rate for n, rate in answer.items()}


def measure(spec: str, clients: Sequence[int], prompt: int, tokens: int, repeat: int, threads: int,
            openvino_python: str | None = None) -> list[str]:
    import relaxc
    from relaxc.runtime.serving.text import Text

    proto = models.fill_light(onnx.load(models.bundled_path(spec)))
    max_length = prompt + tokens + 8
    art = relaxc.compile(proto, tuning="replay", max_length=max_length, max_batch=SLOTS, backends="relaxc")
    folder = tempfile.mkdtemp(prefix="relaxc-serving-")
    library = os.path.join(folder, "decoder.so")
    art.export(library)
    tokenizer = stand_in_tokenizer.write(os.path.join(folder, "tokenizer"), art.decoder["vocab"])
    text = Text.read(tokenizer)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, art.decoder["vocab"], prompt - i).tolist() for i in range(max(clients))]
    expected = []
    for p in prompts:
        out = art.generate(np.array([p]), max_new_tokens=tokens, eos_token_id=EOS)[0, len(p):].tolist()
        expected.append(text.decode(out[:out.index(EOS)] if EOS in out else out))
    served = Served(library, tokenizer, threads)
    table: dict[int, tuple[float, ...]] = {}  # clients -> the medians of rates()
    try:
        for n in clients:
            rounds = []
            for _ in range(repeat):
                results = clients_at_once(served, prompts[:n], tokens)
                wrong = [i for i, r in enumerate(results) if r["text"] != expected[i]]
                if wrong:
                    raise AssertionError(f"{n} clients: clients {wrong} got other text than generate alone")
                rounds.append(rates(results))
            table[n] = tuple(statistics.median(r[i] for r in rounds) for i in range(4))
        late, alone, step = (statistics.median(v) for v in zip(*(arriving_under_load(served, prompts, tokens)
                                                                  for _ in range(repeat))))
    finally:
        served.close()
    engine: dict[int, list[float]] = {n: [] for n in clients}  # tokens/s per round, in process
    peer: dict[int, list[float]] = {n: [] for n in clients}
    for _ in range(repeat):  # relaxc's scheduler alone and OpenVINO GenAI's pipeline, round after round
        for n in clients:  # no HTTP, no client beside it: as OpenVINO GenAI's pipeline runs
            rate, texts = in_process(art, text, prompts[:n], tokens)
            if texts != expected[:n]:
                raise AssertionError(f"{n} requests in process: other text than generate alone")
            engine[n].append(rate)
        if openvino_python:
            for n, rate in openvino(openvino_python, folder, tokenizer, art.decoder["vocab"], clients, prompt, tokens,
                                    1, threads).items():
                peer[n].append(rate)
    lines = [this_cpu("cpu") + ", target `cpu`", "", f"{spec}: prompts of {prompt - max(clients) + 1}-{prompt} tokens, "
             f"{tokens} greedy tokens each, streamed; medians of {repeat} rounds; server on {threads} threads", "",
             "| clients | time to first token (ms) | decode tokens/s per stream | decode tokens/s in all | "
             "in all / one stream's | tokens/s end to end | in process | OpenVINO GenAI, in process | "
             "relaxc / OpenVINO GenAI, in process |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    single = table[clients[0]][2]
    for n, (first, per_stream, together, end_to_end) in table.items():
        ratio = statistics.median(ours / theirs for ours, theirs in zip(engine[n], peer[n])) if peer[n] else None
        theirs = f"{statistics.median(peer[n]):.1f} | {ratio:.2f}x" if peer[n] else "not measured | "
        lines.append(f"| {n} | {first:.0f} | {per_stream:.1f} | {together:.1f} | {together / single:.2f}x | "
                     f"{end_to_end:.1f} | {statistics.median(engine[n]):.1f} | {theirs} |")
    lines += ["", f"A request arriving while 3 others decode: first token after {late:.0f} ms; alone {alone:.0f} ms, "
              f"a step of the 3 {step:.1f} ms: {late:.0f} <= {alone + 2 * step:.0f} "
              f"({'holds' if late <= alone + 2 * step else 'does not hold'})"]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relaxc.benchmarks.serving", description=__doc__.split("\n")[0])
    parser.add_argument("spec", nargs="?", default=SPEC)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--prompt", type=int, default=32, help="tokens of the longest prompt")
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens each client asks")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--openvino-python", metavar="PATH", help="the python of a virtualenv with openvino-genai, "
                        "optimum-intel and torch: OpenVINO GenAI's continuous batching in the same run")
    args = parser.parse_args(argv)
    if max(args.clients) > SLOTS:
        parser.error(f"at most {SLOTS} clients: the decoder is compiled for max_batch {SLOTS}")
    print("\n".join(measure(args.spec, args.clients, args.prompt, args.tokens, args.repeat, args.threads,
                             args.openvino_python)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
