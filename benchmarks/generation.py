"""Decode speed: relaxc's generation against onnxruntime's own greedy loop over the same export.

    .venv/bin/python -m relaxc.benchmarks.generation [SPEC ...] [--cached 128 1024] [--threads 2]

For each decoder with past (default: zoo:gpt2_124m_past and zoo:llama_125m_past, exported by
``benchmarks/export_decoders.py``) and each cache length: both runtimes run the same random prompt
of that many tokens, then decode greedily, one token per step, taking turns in blocks of steps
(``support.turns.alternate``: four blocks each, each after a pause and a warm-up step), so the
cache grows by the same tokens in both while they are timed. Prints the median milliseconds per token, their
ratio, and relaxc's time at the longest cache over its time at the shortest (a step that copied the
cache would grow with it), with the CPU and target named. Batch 1, fp32.
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
from relaxc.support.turns import alternate

SPECS = ("zoo:gpt2_124m_past", "zoo:llama_125m_past")
ROOM = 16  # tokens beyond the longest cache and the timed steps: the warm-up steps'


class OrtLoop:
    """onnxruntime's greedy loop over the export, one step at a time (as ``reference.ort_greedy``)."""

    def __init__(self, proto: onnx.ModelProto, pairs: list[tuple[str, str]], threads: int) -> None:
        self.session = reference.ort_session(proto, threads=threads)
        self.pairs = pairs
        self.positions = "position_ids" in {i.name for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]

    def start(self, prompt: np.ndarray) -> None:
        shape = next(i.shape for i in self.session.get_inputs() if i.name == self.pairs[0][0])
        self.past = {name: np.zeros((1, shape[1], 0, shape[3]), np.float32) for name, _ in self.pairs}
        self.mask = np.zeros((1, 0), np.int64)
        self.token = self._run(prompt)

    def step(self) -> None:
        self.token = self._run(self.token)

    def _run(self, ids: np.ndarray) -> np.ndarray:
        self.mask = np.concatenate([self.mask, np.ones_like(ids)], axis=1)
        feeds = {"input_ids": ids, "attention_mask": self.mask, **self.past}
        if self.positions:
            feeds["position_ids"] = np.arange(self.mask.shape[1] - ids.shape[1], self.mask.shape[1])[None]
        produced = dict(zip(self.outputs, self.session.run(None, feeds)))
        self.past = {name: produced[present] for name, present in self.pairs}
        return np.argmax(produced["logits"][:, -1], axis=-1)[:, None].astype(np.int64)


class RelaxcLoop:
    """relaxc's greedy decoding in a session, one step at a time."""

    def __init__(self, art) -> None:
        self.art = art

    def start(self, prompt: np.ndarray) -> None:
        self.session = self.art.session()
        self.token = np.argmax(self.session.append(prompt), axis=-1)

    def step(self) -> None:
        self.token = np.argmax(self.session.step(self.token), axis=-1)


def measure(spec: str, cached: Sequence[int], steps: int, threads: int) -> list[tuple[int, float, float]]:
    """(cache length, relaxc ms, onnxruntime ms) per token for ``spec`` at each ``cached``."""
    import relaxc

    started = time.perf_counter()
    art = relaxc.compile(spec, max_length=max(cached) + steps + ROOM, backends="relaxc")
    print(f"{spec}: compiled in {time.perf_counter() - started:.0f} s", flush=True)
    ort = OrtLoop(models.fill_light(onnx.load(models.bundled_path(spec))),
                  [tuple(pair) for pair in art.decoder["pairs"]], threads)
    ours = RelaxcLoop(art)
    rows = []
    for length in cached:
        prompt = np.random.default_rng(length).integers(0, art.decoder["vocab"], (1, length))
        ours.start(prompt)
        ort.start(prompt)
        ms = alternate({"relaxc": ours.step, "onnxruntime": ort.step}, steps)
        rows.append((length, ms["relaxc"], ms["onnxruntime"]))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", default=list(SPECS), help="decoders with past (default: %(default)s)")
    parser.add_argument("--cached", type=int, nargs="+", default=[128, 1024], help="cache lengths (default 128 1024)")
    parser.add_argument("--steps", type=int, default=32, help="timed decode steps per runtime (default 32)")
    parser.add_argument("--threads", type=int, default=2, help="threads for both runtimes (default 2)")
    args = parser.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)  # read when TVM's thread pool starts
    print(f"# {this_cpu('cpu')}, target cpu, {args.threads} threads each, batch 1, fp32, onnxruntime "
          f"{reference.onnxruntime().__version__}: greedy decode, median ms per token of {args.steps} steps"
          f"\n\n| model | cached | relaxc (ms) | onnxruntime (ms) | ratio |\n| --- | ---: | ---: | ---: | ---: |",
          flush=True)
    growth = []
    for spec in args.specs:
        rows = measure(spec, args.cached, args.steps, args.threads)
        for length, ours, theirs in rows:
            print(f"| {spec} | {length} | {ours:.2f} | {theirs:.2f} | {ours / theirs:.2f}x |", flush=True)
        growth.append(f"{spec} {rows[-1][1] / rows[0][1]:.2f}x")
    print(f"\nrelaxc at {max(args.cached)} cached over {min(args.cached)}: {', '.join(growth)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
