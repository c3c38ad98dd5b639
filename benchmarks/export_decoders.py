"""Export decoders "with past", as serving tools export them, and commit their light forms.

    pip install -e '.[export]'            # torch, transformers: never for make test
    python -m relaxc.benchmarks.export_decoders [NAME ...] [--out compiler/frontend/zoo]

    pip install -e '.[export-optimum]'    # a virtualenv of its own: optimum-onnx pins transformers < 4.58
    python -m relaxc.benchmarks.export_decoders gpt2_optimum llama_optimum

One step of a Hugging Face causal language model with random weights, exported with the optimum /
transformers naming: ``input_ids [batch, sequence]``, ``attention_mask [batch, past + sequence]``,
``position_ids`` where the model reads them, ``past_key_values.{i}.key/.value [batch, kv_heads,
past, head_dim]`` in; ``logits [batch, sequence, vocab]`` and ``present.{i}.key/.value [batch,
kv_heads, past + sequence, head_dim]`` out; every dim but the heads' symbolic. Two exporters: the
``*_past`` models by ``torch.onnx.export`` (TorchScript, opset 17) of the model over a flat cache;
the ``*_optimum`` ones by ``optimum-cli export onnx --task text-generation-with-past`` from a saved
checkpoint, which is how most decoder files users download are made. The light form
(``models.make_light``) is what ``zoo:<name>`` loads.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass, field

import onnx

from relaxc.benchmarks.export_models import drop_provenance, export_command
from relaxc.frontend import models

SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=512,
             max_position_embeddings=256)  # the tiny decoders make test compiles


@dataclass(frozen=True)
class Decoder:
    config_class: str
    model_class: str
    config: dict = field(default_factory=dict)
    positions: bool = True  # whether the model takes position_ids (TorchScript; optimum decides its own)
    exporter: str = "torchscript"  # or "optimum"


DECODERS: dict[str, Decoder] = {
    "gpt2_past": Decoder("GPT2Config", "GPT2LMHeadModel", dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512,
                                                               n_positions=256), positions=False),
    "llama_past": Decoder("LlamaConfig", "LlamaForCausalLM", dict(SMALL, num_key_value_heads=2)),  # grouped queries
    "qwen2_past": Decoder("Qwen2Config", "Qwen2ForCausalLM", dict(SMALL, num_key_value_heads=2)),  # q/k/v biases
    "phi3_past": Decoder("Phi3Config", "Phi3ForCausalLM", dict(SMALL, num_key_value_heads=4, pad_token_id=0)),  # fused qkv
    "opt_past": Decoder("OPTConfig", "OPTForCausalLM", dict(  # learned positions from the mask, queries scaled first
        num_hidden_layers=2, hidden_size=64, ffn_dim=128, num_attention_heads=4, vocab_size=512,
        max_position_embeddings=256, word_embed_proj_dim=64), positions=False),
    "gpt2_optimum": Decoder("GPT2Config", "GPT2LMHeadModel", dict(  # tied head: larger layers, or it repeats a token
        n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=256, initializer_range=0.2), exporter="optimum"),
    "llama_optimum": Decoder("LlamaConfig", "LlamaForCausalLM", dict(SMALL, num_key_value_heads=2), exporter="optimum"),
    "mistral_optimum": Decoder("MistralConfig", "MistralForCausalLM", dict(  # a window shorter than test prompts
        SMALL, num_key_value_heads=2, sliding_window=16), exporter="optimum"),
    # real widths at two layers, which make test compiles in seconds: plain heads of 64 and a tied head (GPT-2);
    # grouped queries (12 for 4), an untied head (Llama); heads of 128 (8 for 2), q/k/v biases, a tied head (Qwen2)
    "gpt2_768_past": Decoder("GPT2Config", "GPT2LMHeadModel", dict(n_layer=2, vocab_size=32000, n_positions=1024),
                             positions=False),
    "llama_768_past": Decoder("LlamaConfig", "LlamaForCausalLM", dict(
        num_hidden_layers=2, hidden_size=768, intermediate_size=2048, num_attention_heads=12, num_key_value_heads=4,
        vocab_size=32000, max_position_embeddings=1024)),
    "qwen2_1024_past": Decoder("Qwen2Config", "Qwen2ForCausalLM", dict(
        num_hidden_layers=2, hidden_size=1024, intermediate_size=2816, num_attention_heads=8, num_key_value_heads=2,
        vocab_size=32000, max_position_embeddings=1024, tie_word_embeddings=True)),
    # the sizes the decode benchmark measures (benchmarks/generation.py): GPT-2 small, 124 M parameters; a Llama
    # of 12 layers, hidden 768, 4 key/value heads for 12 query heads, 32,000 tokens, 125 M; a Qwen2 as the Llama
    # with 2 key/value heads and biased projections, 122 M
    "gpt2_124m_past": Decoder("GPT2Config", "GPT2LMHeadModel", dict(n_positions=2048), positions=False),
    "llama_125m_past": Decoder("LlamaConfig", "LlamaForCausalLM", dict(
        num_hidden_layers=12, hidden_size=768, intermediate_size=2048, num_attention_heads=12, num_key_value_heads=4,
        vocab_size=32000, max_position_embeddings=2048)),
    "qwen2_122m_past": Decoder("Qwen2Config", "Qwen2ForCausalLM", dict(
        num_hidden_layers=12, hidden_size=768, intermediate_size=2048, num_attention_heads=12, num_key_value_heads=2,
        vocab_size=32000, max_position_embeddings=2048)),
    # and as optimum exports them, with a Phi-3 (fused projections, 12 key/value heads, 32,064 tokens, 126 M) and
    # OPT-125m itself (transformers' default OPTConfig)
    "gpt2_124m_optimum": Decoder("GPT2Config", "GPT2LMHeadModel", dict(n_positions=2048), exporter="optimum"),
    "llama_125m_optimum": Decoder("LlamaConfig", "LlamaForCausalLM", dict(
        num_hidden_layers=12, hidden_size=768, intermediate_size=2048, num_attention_heads=12, num_key_value_heads=4,
        vocab_size=32000, max_position_embeddings=2048), exporter="optimum"),
    "qwen2_122m_optimum": Decoder("Qwen2Config", "Qwen2ForCausalLM", dict(
        num_hidden_layers=12, hidden_size=768, intermediate_size=2048, num_attention_heads=12, num_key_value_heads=2,
        vocab_size=32000, max_position_embeddings=2048), exporter="optimum"),
    "phi3_126m_optimum": Decoder("Phi3Config", "Phi3ForCausalLM", dict(
        num_hidden_layers=12, hidden_size=768, intermediate_size=2048, num_attention_heads=12, num_key_value_heads=12,
        vocab_size=32064, max_position_embeddings=2048, pad_token_id=0), exporter="optimum"),
    "opt_125m_optimum": Decoder("OPTConfig", "OPTForCausalLM", exporter="optimum"),
}


def _step(model, layers: int, positions: bool):
    """``model`` as one step over flat past keys and values, returning logits and flat presents."""
    import torch
    from transformers import DynamicCache

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, *rest):
            position_ids, past = (rest[0], rest[1:]) if positions else (None, rest)
            cache = DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            extra = {"position_ids": position_ids} if positions else {}
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                             use_cache=True, **extra)
            return (out.logits, *(t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)))

    return Step()


def export(name: str, out_dir: str, seed: int = 0) -> str:
    """Export ``name`` and write its light form to ``out_dir``; returns the path."""
    import torch
    import transformers

    torch.manual_seed(seed)
    spec = DECODERS[name]
    config = getattr(transformers, spec.config_class)(**spec.config)
    model = getattr(transformers, spec.model_class)(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        full = _optimum(model, tmp) if spec.exporter == "optimum" else _torchscript(model, config, spec, tmp)
    drop_provenance(full)
    exporter = "optimum-onnx " + _version("optimum-onnx") if spec.exporter == "optimum" else "TorchScript (opset 17)"
    light = models.make_light(full, source=f"{spec.model_class} with past exported by {exporter}, "
                              f"torch {torch.__version__}, transformers {transformers.__version__}",
                              input_high={"input_ids": config.vocab_size, "attention_mask": 2})
    target = os.path.join(out_dir, f"{name}.onnx")
    onnx.save(light, target)
    return target


def _version(package: str) -> str:
    from importlib.metadata import version
    return version(package)


def _optimum(model, tmp: str) -> onnx.ModelProto:
    """``optimum-cli export onnx --task text-generation-with-past`` of ``model``, saved to a checkpoint."""
    from optimum.exporters.onnx import main_export

    model.save_pretrained(os.path.join(tmp, "checkpoint"))
    main_export(os.path.join(tmp, "checkpoint"), output=os.path.join(tmp, "onnx"), task="text-generation-with-past")
    return onnx.load(os.path.join(tmp, "onnx", "model.onnx"))


def _torchscript(model, config, spec: Decoder, tmp: str) -> onnx.ModelProto:
    """``torch.onnx.export`` (TorchScript) of one step of ``model`` over a flat cache."""
    import torch

    layers, heads = config.num_hidden_layers, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    batch, sequence, past = 2, 3, 5  # an example batch of 1 would be specialised to 1
    kv = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    inputs = ["input_ids", "attention_mask", *(["position_ids"] if spec.positions else []), *kv]
    outputs = ["logits", *(name.replace("past_key_values", "present") for name in kv)]
    args = (torch.randint(0, config.vocab_size, (batch, sequence)),
            torch.ones(batch, past + sequence, dtype=torch.int64),
            *([torch.arange(past, past + sequence).repeat(batch, 1)] if spec.positions else []),
            *(torch.randn(batch, kv_heads, past, head_dim) for _ in kv))
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "total"},
            "position_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"},
            **{n: {0: "batch", 2: "past"} for n in kv}, **{n: {0: "batch", 2: "total"} for n in outputs[1:]}}
    path = os.path.join(tmp, "model.onnx")
    with torch.no_grad():
        torch.onnx.export(_step(model, layers, spec.positions), args, path, dynamo=False, opset_version=17,
                          input_names=inputs, output_names=outputs, dynamic_axes=axes)
    return onnx.load(path)


def main(argv: list[str] | None = None) -> int:
    return export_command(argv, __doc__.splitlines()[0], list(DECODERS), export)


if __name__ == "__main__":
    sys.exit(main())
