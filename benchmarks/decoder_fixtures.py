"""transformers' own greedy ``generate`` on the zoo's TorchScript decoders, saved beside them as a second
reference to onnxruntime's loop (which runs the export, so it shares any flaw of the export's own: GPT-2's
positions counted from the cache's length, say).

    pip install -e '.[export]'            # torch, transformers: never for make test
    python -m relaxc.benchmarks.decoder_fixtures [NAME ...] [--out compiler/frontend/zoo]

For each decoder: its transformers model (``export_decoders.DECODERS``, the head untied, as the light form's
filled weights are) takes the weights ``models.fill_light`` gives the committed light form, parameter by
parameter (by name, or through the MatMul that reads a transposed copy); then greedy ``generate`` of a prompt
alone and of a left-padded batch of prompts of different lengths, with each new token's margin over the
runner-up (so that a test can tell a near tie from a difference). Written to ``<name>.generate.json``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import onnx
from onnx import numpy_helper

from relaxc.benchmarks.export_decoders import DECODERS
from relaxc.benchmarks.export_models import export_command
from relaxc.frontend import models

NEW_TOKENS, SEED = 24, 0


def prompts(vocab: int) -> dict[str, list]:
    """The prompts every fixture runs: one of 20 tokens; a batch of 20, 13 and 7 tokens, left-padded."""
    rng = np.random.default_rng(SEED)
    ids = rng.integers(0, vocab, (3, 20))
    mask = np.ones_like(ids)
    mask[1, :7], mask[2, :13] = 0, 0
    return {"single": ids[:1].tolist(), "batch": (ids * mask).tolist(), "mask": mask.tolist()}


def _weights(light: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The filled light form's weights by the transformers parameter they are (the export wraps the model as
    ``model``; a Linear's weight is read transposed by ``/model/<module path>/MatMul``)."""
    filled = models.fill_light(light)
    values = {init.name: numpy_helper.to_array(init) for init in filled.graph.initializer}
    weights = {name[len("model."):]: value for name, value in values.items() if name.startswith("model.")}
    for node in filled.graph.node:
        if node.op_type == "MatMul" and node.input[1] in values and not node.input[1].startswith("model."):
            module = node.name.removeprefix("/model/").removesuffix("/MatMul").replace("/", ".")
            weights[f"{module}.weight"] = values[node.input[1]].T
    return weights


def fixture(name: str, out_dir: str) -> str:
    import torch
    import transformers

    spec = DECODERS[name]
    config = getattr(transformers, spec.config_class)(**{**spec.config, "tie_word_embeddings": False})
    model = getattr(transformers, spec.model_class)(config).eval()
    light = onnx.load(models.bundled_path(f"zoo:{name}"))
    weights = _weights(light)
    state = model.state_dict()
    missing = [key for key, value in state.items() if key not in weights and value.numel() > 1
               and not torch.all(value == value.flatten()[0])]
    if missing:
        raise SystemExit(f"{name}: no weight of the light form for {missing[:5]}")
    model.load_state_dict({key: torch.from_numpy(np.ascontiguousarray(weights[key])).reshape(value.shape)
                           if key in weights else value for key, value in state.items()})
    model.generation_config.eos_token_id = None  # every row runs NEW_TOKENS steps, as the test's generate does
    given = prompts(config.vocab_size)
    result = {"source": f"transformers {transformers.__version__} greedy generate, torch {torch.__version__}",
              "new_tokens": NEW_TOKENS, "prompts": given}
    for case, (ids, mask) in {"single": (given["single"], None), "batch": (given["batch"], given["mask"])}.items():
        ids = torch.tensor(ids)
        out = model.generate(ids, attention_mask=torch.ones_like(ids) if mask is None else torch.tensor(mask),
                             max_new_tokens=NEW_TOKENS, do_sample=False, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=0)
        scores = torch.stack(out.scores, dim=1)  # [batch, new, vocab]
        top = torch.topk(scores, 2, dim=-1).values
        result[case] = {"tokens": out.sequences[:, ids.shape[1]:].tolist(),
                        "margins": ((top[..., 0] - top[..., 1]) / scores.abs().amax(-1)).tolist()}
    target = os.path.join(out_dir, f"{name}.generate.json")
    with open(target, "w", encoding="utf-8") as file:
        json.dump(result, file)
    return target


def main(argv: list[str] | None = None) -> int:
    torchscript = [name for name, spec in DECODERS.items() if spec.exporter == "torchscript"]
    return export_command(argv, __doc__.splitlines()[0], torchscript, fixture)


if __name__ == "__main__":
    sys.exit(main())
