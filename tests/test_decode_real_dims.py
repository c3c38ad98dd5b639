"""Generation at real widths: two-layer decoders of hidden 768 and 1,024, heads of 64 and 128, grouped and
plain heads, tied and untied heads, 32,000 tokens (``zoo:gpt2_768_past``, ``zoo:llama_768_past``,
``zoo:qwen2_1024_past``, exported by benchmarks/export_decoders.py), every step's logits against
onnxruntime's, teacher-forced, through ``decode`` and after export and load, with memory validation on
(tiny decoders hid a decode program that read memory it never wrote from 10 heads on); and the
programs' own bounds on the cache."""

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
