"""relaxc's greedy tokens against transformers' own ``generate`` (fixtures saved beside the zoo's TorchScript
decoders by benchmarks/decoder_fixtures.py, from the same filled weights): a prompt alone, and a left-padded
batch of prompts of different lengths. A second reference beside onnxruntime's loop, which runs the export
and shares its flaws (GPT-2's positions counted from the cache's length)."""

import glob
import json
import os

import numpy as np
import onnx
import pytest

import relaxc
from relaxc.frontend import models

FIXTURES = sorted(glob.glob(os.path.join(os.path.dirname(models.bundled_path("zoo:gpt2_past")), "*.generate.json")))
TIE = 1e-4  # of max|logit|: a first difference where transformers' top two are this close is a tie, not an error


def _agrees(got: np.ndarray, want: list, margins: list) -> None:
    """Equal tokens, or a first difference where transformers' own top two tie within ``TIE``."""
    for row, (ours, theirs, margin) in enumerate(zip(got, want, margins)):
        differs = np.nonzero(np.asarray(ours) != np.asarray(theirs))[0]
        if differs.size:
            step = int(differs[0])
            assert margin[step] <= TIE, f"row {row} differs at new token {step}: {list(ours)} against {theirs}"


@pytest.mark.slow
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: os.path.basename(p).split(".")[0])
def test_greedy_tokens_equal_transformers_generate_alone_and_left_padded(path):
    fixture = json.load(open(path, encoding="utf-8"))
    name, new, prompts = os.path.basename(path).split(".")[0], fixture["new_tokens"], fixture["prompts"]
    proto = models.fill_light(onnx.load(models.bundled_path(f"zoo:{name}")))
    batch = np.array(prompts["batch"])
    art = relaxc.compile(proto, tuning="off", max_length=batch.shape[1] + new, max_batch=len(batch), backends="relaxc")
    single = np.array(prompts["single"])
    _agrees(art.generate(single, max_new_tokens=new)[:, single.shape[1]:], fixture["single"]["tokens"],
            fixture["single"]["margins"])
    got = art.generate(batch, np.array(prompts["mask"]), max_new_tokens=new)[:, batch.shape[1]:]
    _agrees(got, fixture["batch"]["tokens"], fixture["batch"]["margins"])


def test_every_torchscript_decoder_of_the_zoo_but_opt_has_a_fixture():
    names = {os.path.basename(p).split(".")[0] for p in FIXTURES}
    assert {"gpt2_past", "llama_past", "qwen2_past", "phi3_past", "gpt2_768_past", "llama_768_past",
            "qwen2_1024_past"} <= names
