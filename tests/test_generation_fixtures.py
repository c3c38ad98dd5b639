"""relaxc's greedy tokens against transformers' own ``generate`` (fixtures saved beside the zoo's TorchScript
decoders by benchmarks/decoder_fixtures.py, from the same filled weights): a prompt alone, and a left-padded
batch of prompts of different lengths. A second reference beside onnxruntime's loop, which runs the export
and shares its flaws (GPT-2's positions counted from the cache's length). The decoders other test modules
compile are checked there (``reference.assert_generates_as_transformers``); the others here."""

import pytest

import relaxc
from tests import reference

ELSEWHERE = {"gpt2_past", "llama_past",  # tests/test_generation.py
             "gpt2_768_past", "llama_768_past", "qwen2_1024_past"}  # tests/test_decode_real_dims.py


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(reference.transformers_fixtures()) - ELSEWHERE))
def test_greedy_tokens_equal_transformers_generate_alone_and_left_padded(name):
    art = relaxc.compile(f"zoo:{name}", tuning="off", max_length=64, max_batch=3, backends="relaxc")
    reference.assert_generates_as_transformers(art, name)


def test_every_torchscript_decoder_of_the_zoo_but_opt_has_a_fixture():
    assert set(reference.transformers_fixtures()) == ELSEWHERE | {"qwen2_past", "phi3_past"}
