"""Decode speed: relaxc's generation against onnxruntime's own greedy loop over the same export.

    .venv/bin/python -m relaxc.benchmarks.generation [SPEC ...] [--cached 128 1024] [--threads 2] [--batch 1]
    .venv/bin/python -m relaxc.benchmarks.generation --check [SPEC ...] [--steps 64] [--batch 1] [--threads 2]

For each decoder with past (default: ``SPECS``, GPT-2, Llama and Qwen2 exported by TorchScript, and those with
Phi-3 and OPT by optimum, 122 to 126 M parameters: ``benchmarks/export_decoders.py``) and each cache length: both
runtimes run the same random prompt of that many tokens, each in a session of its own, then every session decodes
greedily, one token per step, all of them taking turns in blocks of steps (``support.turns.paired``: six rounds of
blocks, each after a pause and a warm-up step, each time as its ratio to the first session's in the same round), so
a neighbour's burst slows every length alike. Prints the median milliseconds per token, their ratio, and relaxc's
time at the longest cache over its time at the shortest (a step that copied the cache would grow with
it), with the CPU and target named. Batch 1 unless ``--batch``, fp32. ``--check`` times nothing: it compares
every step's logits with onnxruntime's (``check``), as the numbers above are worth only that much.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

import numpy as np
import onnx

from relaxc.benchmarks import reference
from relaxc.benchmarks.bench import this_cpu
from relaxc.frontend import models
from relaxc.support.turns import paired

SPECS = ("zoo:gpt2_124m_past", "zoo:llama_125m_past", "zoo:qwen2_122m_past",  # TorchScript
         "zoo:gpt2_124m_optimum", "zoo:llama_125m_optimum", "zoo:qwen2_122m_optimum", "zoo:phi3_126m_optimum",
         "zoo:opt_125m_optimum")  # optimum's exporter
ROOM = 17  # tokens beyond the longest cache and the timed steps: the checked step's and the warm-up steps'
CHECK_PROMPT = 32  # --check: the prompt's tokens, then --steps decode steps
CHECK_TOLERANCE = 1e-4  # of max|logit|: how far a step's logits may be from onnxruntime's


class Greedy:
    """Greedy decoding one step at a time over a session (relaxc's, or ``reference.OrtDecoder``)."""

    def __init__(self, session) -> None:
        self.session = session

    def start(self, prompt: np.ndarray) -> None:
        """The prompt, then one decode step, whose logits (``first``) the benchmark compares across runtimes."""
        self.first = self.session.step(np.argmax(self.session.append(prompt), axis=-1))
        self.token = np.argmax(self.first, axis=-1)

    def step(self) -> None:
        self.token = np.argmax(self.session.step(self.token), axis=-1)


def measure(spec: str, cached: Sequence[int], steps: int, threads: int,
            batch: int = 1) -> list[tuple[int, float, float, float]]:
    """(cache length, relaxc ms, onnxruntime ms, the first decode step's largest logit difference relative
    to max|logit|) per step of ``batch`` rows for ``spec`` at each ``cached``: the program timed is checked."""
    import relaxc

    started = time.perf_counter()
    art = relaxc.compile(spec, max_length=max(cached) + steps + ROOM, max_batch=batch, backends="relaxc")
    print(f"{spec}: compiled in {time.perf_counter() - started:.0f} s", flush=True)
    session = reference.ort_session(models.fill_light(onnx.load(models.bundled_path(spec))), threads=threads)
    runs = {}
    for length in cached:
        prompt = np.random.default_rng(length).integers(0, art.decoder["vocab"], (batch, length))
        for name, decoder in (("relaxc", art.session()), ("onnxruntime", reference.OrtDecoder(
                session, [tuple(pair) for pair in art.decoder["pairs"]]))):
            runs[name, length] = Greedy(decoder)
            runs[name, length].start(prompt)
    ms = paired({key: greedy.step for key, greedy in runs.items()}, steps)
    errors = {length: float(np.abs(runs["relaxc", length].first - runs["onnxruntime", length].first).max()
                            / np.abs(runs["onnxruntime", length].first).max()) for length in cached}
    return [(length, ms["relaxc", length], ms["onnxruntime", length], errors[length]) for length in cached]


def check(spec: str, steps: int, batch: int, threads: int, folder: str) -> list[tuple[str, float]]:
    """Each program of ``spec`` compiled with ``validate_memory`` checked against onnxruntime over the same
    prompt and ``steps`` teacher-forced decode steps (``reference.teacher_forced``), in memory and after export
    and ``relaxc.load``: (where, the largest relative logit difference of any step)."""
    import relaxc

    proto = models.fill_light(onnx.load(models.bundled_path(spec)))
    art = relaxc.compile(proto, max_length=CHECK_PROMPT + steps, max_batch=batch, backends="relaxc",
                         validate_memory=True)
    art.export(os.path.join(folder, "decoder.so"))
    ort = reference.ort_session(proto, threads=threads)
    pairs = [tuple(pair) for pair in art.decoder["pairs"]]
    prompt = np.random.default_rng(0).integers(0, art.decoder["vocab"], (batch, CHECK_PROMPT))
    return [(where, max(reference.teacher_forced(runner.session(), reference.OrtDecoder(ort, pairs), prompt, steps)))
            for where, runner in (("compiled", art), ("loaded", relaxc.load(os.path.join(folder, "decoder.so"))))]


def _check(specs: Sequence[str], steps: int, batch: int, threads: int) -> int:
    """``check`` on each decoder; 1 if any step is off by more than ``CHECK_TOLERANCE``."""
    import tempfile

    print(f"# {this_cpu('cpu')}, target cpu, {threads} threads, batch {batch}: the largest logit difference of a "
          f"{CHECK_PROMPT}-token prompt and {steps} teacher-forced decode steps against onnxruntime, relative to "
          f"max|logit|, memory validation on\n\n| model | compiled | exported and loaded |\n| --- | ---: | ---: |",
          flush=True)
    wrong = 0
    for spec in specs:
        with tempfile.TemporaryDirectory() as folder:
            found = dict(check(spec, steps, batch, threads, folder))
        wrong += any(error > CHECK_TOLERANCE for error in found.values())
        print(f"| {spec} | {found['compiled']:.1e} | {found['loaded']:.1e} |", flush=True)
    print(f"\n{len(specs) - wrong} of {len(specs)} within {CHECK_TOLERANCE:g}")
    return 1 if wrong else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", default=list(SPECS), help="decoders with past (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="check every step's logits against onnxruntime "
                        f"(teacher-forced, memory validation on) instead of timing; exit 1 past {CHECK_TOLERANCE:g}")
    parser.add_argument("--cached", type=int, nargs="+", default=[128, 1024], help="cache lengths (default 128 1024)")
    parser.add_argument("--steps", type=int, help="timed decode steps per runtime (default 32; checked: 64)")
    parser.add_argument("--threads", type=int, default=2, help="threads for both runtimes (default 2)")
    parser.add_argument("--batch", type=int, default=1, help="rows decoded together (default 1)")
    args = parser.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)  # read when TVM's thread pool starts
    if args.check:
        return _check(args.specs, args.steps or 64, args.batch, args.threads)
    args.steps = args.steps or 32
    print(f"# {this_cpu('cpu')}, target cpu, {args.threads} threads each, batch {args.batch}, fp32, onnxruntime "
          f"{reference.onnxruntime().__version__}: greedy decode, median ms per step of {args.steps} steps"
          f"; the first decode step's logits against onnxruntime's (largest difference, relative to max|logit|)"
          f"\n\n| model | cached | relaxc (ms) | onnxruntime (ms) | ratio | logits |\n| --- | ---: | ---: | ---: | ---: | ---: |",
          flush=True)
    growth, wrong = [], 0
    for spec in args.specs:
        rows = measure(spec, args.cached, args.steps, args.threads, args.batch)
        for length, ours, theirs, error in rows:
            wrong += error > CHECK_TOLERANCE
            print(f"| {spec} | {length} | {ours:.2f} | {theirs:.2f} | {ours / theirs:.2f}x | {error:.1e}"
                  f"{' WRONG' if error > CHECK_TOLERANCE else ''} |", flush=True)
        growth.append(f"{spec} {rows[-1][1] / rows[0][1]:.2f}x")
    print(f"\nrelaxc at {max(args.cached)} cached over {min(args.cached)}: {', '.join(growth)}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
