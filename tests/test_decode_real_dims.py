"""Generation at real widths: two-layer decoders of hidden 768 and 1,024, heads of 64 and 128, grouped and
plain heads, tied and untied heads, 32,000 tokens (``zoo:gpt2_768_past``, ``zoo:llama_768_past``,
``zoo:qwen2_1024_past``, exported by benchmarks/export_decoders.py), every step's logits against
onnxruntime's, teacher-forced, through ``decode`` and after export and load, with memory validation on
(tiny decoders hid a decode program that read memory it never wrote from 10 heads on); rows cached to
lengths of their own stepping together, each as it steps alone; and the programs' own bounds on the cache."""

import numpy as np
import onnx
import pytest

import relaxc
from relaxc.frontend import models
from relaxc.support.cache_layout import CacheLayout
from tests.helpers import call_program
from tests import reference

REAL = ("gpt2_768_past", "llama_768_past", "qwen2_1024_past")
PROMPT, STEPS, BATCH = 20, 64, 4
MAX_LENGTH = PROMPT + STEPS  # 84: not a multiple of any vector width, so the cache has rows beyond it
TOLERANCE = 1e-4  # of max|logit|


@pytest.fixture(scope="module", params=REAL)
def real(request):
    proto = models.fill_light(onnx.load(models.bundled_path(f"zoo:{request.param}")))
    art = relaxc.compile(proto, tuning="off", max_length=MAX_LENGTH, max_batch=BATCH, backends="relaxc",
                         validate_memory=True)
    return art, reference.ort_session(proto)


def _errors(runner, art, ort, batch: int) -> list[float]:
    prompt = np.random.default_rng(batch).integers(0, art.decoder["vocab"], (batch, PROMPT))
    decoder = reference.OrtDecoder(ort, [tuple(pair) for pair in art.decoder["pairs"]])
    return reference.teacher_forced(runner.session(), decoder, prompt, STEPS)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, BATCH])
def test_every_decode_step_equals_onnxruntimes(real, batch):
    art, ort = real
    assert art.report()["memory"]["validated"] and "decode" in art.report()["memory"]["programs"]
    errors = _errors(art, art, ort, batch)
    assert max(errors) <= TOLERANCE, f"steps off by more than {TOLERANCE}: {[(i, e) for i, e in enumerate(errors) if e > TOLERANCE][:5]}"
    reference.assert_relaxc_ran(art)


@pytest.mark.slow
def test_greedy_tokens_equal_transformers_generate_alone_and_left_padded(real, request):
    reference.assert_generates_as_transformers(real[0], request.node.callspec.params["real"])


@pytest.mark.slow
def test_every_decode_step_equals_onnxruntimes_after_export_and_load(real, tmp_path):
    art, ort = real
    art.export(tmp_path / "decoder.so")
    errors = _errors(relaxc.load(tmp_path / "decoder.so"), art, ort, 1)
    assert max(errors) <= TOLERANCE, f"steps off by more than {TOLERANCE}: {errors}"


@pytest.mark.slow
def test_the_programs_refuse_a_step_outside_the_cache(real):
    """``past + sequence`` over the cache's rows is an InputError from the compiled code itself,
    whatever calls it, never a write outside the cache; up to the rows it runs."""
    art, _ = real
    rows = CacheLayout.from_json(art.decoder["cache"]).rows
    assert rows > MAX_LENGTH
    call_program(art, "decode", rows - 1, 1)
    call_program(art, "main", rows - 3, 3)
    for function, past, sequence in (("decode", rows, 1), ("decode", rows + 40, 1), ("main", rows - 2, 3)):
        with pytest.raises(relaxc.InputError, match=f"outside the cache's {rows} rows"):
            call_program(art, function, past, sequence)
    call_program(art, "decode", 30, 1, write_at=12)
    for at in (-1, 31):
        with pytest.raises(relaxc.InputError, match="outside 0..past"):
            call_program(art, "decode", 30, 1, write_at=at)


def _alone(art, prompt: np.ndarray, steps: int, chunks: int) -> tuple[list[np.ndarray], list[int]]:
    """Greedy logits and tokens of ``prompt`` decoded alone at batch 1, appended in ``chunks``."""
    session = art.session()
    for chunk in np.array_split(prompt, chunks):
        logits = session.append(chunk[None])[0]
    seen, tokens = [], []
    for _ in range(steps):
        seen.append(logits)
        tokens.append(int(np.argmax(logits)))
        logits = session.step([tokens[-1]])[0]
    return seen, tokens


@pytest.mark.slow
def test_rows_of_different_lengths_step_bitwise_as_each_alone(real):
    """Continuous batching's rows: prompts of 7, 20, 3 and 13 tokens join a running batch at different
    steps (one prefilled in two chunks, one into the slot another left), each row writing its cache at
    its own length; every row's logits at every step equal, bit for bit, the same prompt's decoded alone."""
    art, _ = real
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, art.decoder["vocab"], n) for n in (7, 20, 3, 13)]
    steps, chunks = 12, [1, 2, 1, 1]  # a server prefills a long prompt in chunks between steps
    alone = [_alone(art, p, steps, n) for p, n in zip(prompts, chunks)]
    rows = art.rows()
    joins = {0: (0, 0), 3: (1, 1), 5: (2, 2), 15: (3, 1)}  # tick -> (prompt, slot): 3 takes the slot 1 left
    slots, logits, seen = {}, {}, {p: [] for p in range(len(prompts))}  # prompt -> its slot, next logits, seen
    for tick in range(40):
        if tick in joins:
            p, slot = joins[tick]
            for chunk in np.array_split(prompts[p], chunks[p]):
                logits[p] = rows.prefill(slot, chunk)
            slots[p] = slot
        for p in list(slots):
            seen[p].append(logits[p])
            if len(seen[p]) == steps:
                rows.free(slots.pop(p))  # leaves at once
        if slots:
            live = list(slots)
            stepped = rows.step([slots[p] for p in live], [alone[p][1][len(seen[p]) - 1] for p in live])
            logits |= dict(zip(live, stepped))
    for p in range(len(prompts)):
        assert len(seen[p]) == steps
        for step, (got, want) in enumerate(zip(seen[p], alone[p][0])):
            assert np.array_equal(got, want), f"prompt {p} step {step}: off by {np.abs(got - want).max()}"
