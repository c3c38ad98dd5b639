"""Candidates taking turns in rounds of timed runs: relaxc's one timing helper (``in_turns``).

Every measured decision times its candidates this way: the implementations of a convolution and
the layouts (``schedules/dispatch.py``, each run cold on a TVM timer), the schedules of a kernel
(``schedules/selection.py``), the backends (``compiler/build/backend_candidates.py``, paired round by round),
and the machine's limits (``compiler/build/roofline.py``, the best of a block); so does every
relaxc-against-onnxruntime benchmark (``benchmarks.harness``, as ``alternate``;
``tools/experiments``). It imports nothing of relaxc, so ``tools/experiments/deployed.py`` loads it
by its path where only TVM's runtime is installed."""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

ROUNDS = 4  # blocks per runtime
IDLE_S = 0.1  # pause before each block: onnxruntime's workers spin about 50 ms after their last task


def in_turns(turns: dict[str, Callable[[int], list[float]]], rounds: int) -> dict[str, list[list[float]]]:
    """Each candidate's timed runs (milliseconds), turn by turn: ``turns[name](round)`` times one
    turn of it and returns its runs, the candidates taking turns for ``rounds`` rounds, each round
    starting one candidate further on (so none always follows the same one)."""
    runs: dict[str, list[list[float]]] = {name: [] for name in turns}
    names = list(turns)
    for round_ in range(rounds):
        start = round_ % len(names)
        for name in names[start:] + names[:start]:
            runs[name].append(turns[name](round_))
    return runs


def block(fn: Callable[[], object], runs: int, idle_s: float = IDLE_S) -> list[float]:
    """Milliseconds of ``runs`` calls of ``fn`` after a pause of ``idle_s`` (the other runtime's
    thread pool goes idle) and one untimed warm-up call."""
    time.sleep(idle_s)
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def rounds_of_blocks(runs: dict[str, Callable[[], object]], repeat: int, rounds: int) -> dict[str, list[list[float]]]:
    """Each function's timed runs (milliseconds), block by block: ``repeat`` calls in all, the
    functions taking turns in ``rounds`` blocks each, each round starting one function further on
    (so none always follows the same one)."""
    return in_turns({name: (lambda round_, fn=fn: block(fn, repeat // rounds + (round_ < repeat % rounds)))
                     for name, fn in runs.items()}, rounds)


def alternate(runs: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Median milliseconds of ``repeat`` calls of each function, the functions taking turns in
    ``ROUNDS`` blocks (one after another per call measured thread-pool contention instead)."""
    blocks = rounds_of_blocks(runs, repeat, ROUNDS)
    return {name: statistics.median(t for times in each for t in times) for name, each in blocks.items()}


def paired(runs: dict[str, Callable[[], object]], repeat: int, rounds: int = 6) -> dict[str, float]:
    """Milliseconds of each function as its ratio to the first one, block against block within each
    of ``rounds`` rounds (median over rounds), times the first one's median: a neighbour's burst
    that slows one round slows every function in it, and one that slows a few blocks moves a few
    of the ``rounds`` ratios, not the median."""
    return paired_times(round_medians(runs, repeat, rounds))


def round_medians(runs: dict[str, Callable[[], object]], repeat: int, rounds: int) -> dict[str, list[float]]:
    """Each function's median milliseconds in each of ``rounds`` rounds of blocks (``repeat`` calls
    in all, at least one a block); ``paired_times`` makes them times, ``ratio_range`` a ratio's spread."""
    return {name: [statistics.median(times) for times in each]
            for name, each in rounds_of_blocks(runs, max(repeat, rounds), rounds).items()}


def paired_times(medians: dict[str, list[float]]) -> dict[str, float]:
    """``paired``'s times from ``round_medians`` (the first function's the base)."""
    base = next(iter(medians.values()))
    scale = statistics.median(base)
    return {name: scale * statistics.median(m / b for m, b in zip(values, base)) for name, values in medians.items()}


def ratio_range(medians: dict[str, list[float]], name: str, other: str, confidence: float = 0.95) -> tuple[float, float]:
    """Where the median over the rounds of ``name``'s block against ``other``'s lies with
    ``confidence``, from the rounds' ratios alone (order statistics: no assumption on how a noisy
    host spreads them): 24 rounds of one build against itself spanned up to 0.91-1.08 on a Zen 3
    VM whose blocks moved up to 2x between rounds (ShuffleNet-V2 x0.5)."""
    ratios = sorted(m / o for m, o in zip(medians[name], medians[other]))
    n = len(ratios)
    below, k = 0.0, 0  # the largest k with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2
    while k < n // 2 and below + math.comb(n, k) / 2 ** n <= (1 - confidence) / 2:
        below += math.comb(n, k) / 2 ** n
        k += 1
    return ratios[max(k - 1, 0)], ratios[n - max(k, 1)]
