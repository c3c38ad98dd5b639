"""Export real transformer and CNN architectures with random weights and commit their light forms.

    pip install -e '.[export]'            # torch, torchvision, transformers, onnxscript: never for make test
    python -m relaxc.benchmarks.export_models [NAME ...] [--out compiler/frontend/zoo]

Each model is built from its library's real architecture code with a small or standard config and
random weights, exported by the exporter users run (``torch.onnx.export``: the TorchScript exporter
at opset 17 and the dynamo exporter at opset 18 or 23, which writes its weights to an external data file),
then reduced to its light form (``relaxc.frontend.models.make_light``: every float weight becomes a
shape-only placeholder that the loader fills with seeded random values of the original's mean and
standard deviation). The light file is what is committed and what ``zoo:<name>`` loads.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable

import onnx

from relaxc.frontend import models


@dataclass(frozen=True)
class Export:
    build: Callable[[], tuple[object, tuple, list[str], list[str], dict[str, int]]]
    dynamo: bool  # the dynamo exporter (external data) or TorchScript (opset 17)
    opset: int = 18  # the dynamo exporter's: 23 makes it emit the standard Attention and Gelu
    dynamic: tuple[str, ...] = ()  # dims exported as dynamic, by name: every input's "batch" (dim 0), "sequence" (dim 1)


DYNAMIC_AXES = {"batch": 0, "sequence": 1}  # where each named dynamic dim is in every input that has it


def _tokens(torch, seq: int, vocab: int, mask: bool):
    ids = torch.randint(0, vocab, (1, seq))
    if not mask:
        return (ids,), ["input_ids"]
    attention = torch.ones(1, seq, dtype=torch.int64)
    attention[0, seq - seq // 4:] = 0  # padded tail
    return (ids, attention), ["input_ids", "attention_mask"]


def _bert():
    import torch
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
    args, names = _tokens(torch, 128, config.vocab_size, mask=True)
    return BertModel(config, add_pooling_layer=False), args, names, ["last_hidden_state"], \
        {"input_ids": config.vocab_size, "attention_mask": 2}


def _bert_attention_op23():
    """BERT through PyTorch's scaled-dot-product attention: the dynamo exporter at opset 23 writes
    the standard ``Attention`` and ``Gelu`` operators, which TVM's importer does not convert."""
    import torch
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                        attn_implementation="sdpa")
    args, names = _tokens(torch, 128, config.vocab_size, mask=True)
    return BertModel(config, add_pooling_layer=False), args, names, ["last_hidden_state"], \
        {"input_ids": config.vocab_size, "attention_mask": 2}


def _gpt2():
    import torch
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_embd=256, n_layer=4, n_head=4, n_positions=256, use_cache=False)
    args, names = _tokens(torch, 64, config.vocab_size, mask=False)
    return GPT2Model(config), args, names, ["last_hidden_state"], {"input_ids": config.vocab_size}


def _gpt2_lm():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=256, n_layer=4, n_head=4, n_positions=256, use_cache=False)
    args, names = _tokens(torch, 64, config.vocab_size, mask=False)
    return GPT2LMHeadModel(config), args, names, ["logits"], {"input_ids": config.vocab_size}


def _distilbert():
    import torch
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig()  # distilbert-base: 6 layers, hidden 768, 12 heads
    args, names = _tokens(torch, 128, config.vocab_size, mask=True)
    return DistilBertModel(config), args, names, ["last_hidden_state"], \
        {"input_ids": config.vocab_size, "attention_mask": 2}


def _vit():
    import torch
    from transformers import ViTConfig, ViTModel

    config = ViTConfig()  # ViT-B/16, 224x224
    return ViTModel(config, add_pooling_layer=False), (torch.randn(1, 3, 224, 224),), ["pixel_values"], \
        ["last_hidden_state"], {}


def _torchvision(name: str, size: int = 224):
    """A torchvision architecture (classifier or segmentation net) for a 1x3x``size``x``size`` image."""
    def build():
        import torch
        import torchvision

        extra = {"weights_backbone": None} if name.startswith(("lraspp", "deeplab", "fcn")) else {}
        model = torchvision.models.get_model(name, weights=None, **extra)
        return model, (torch.randn(1, 3, size, size),), ["image"], ["out"], {}
    return build


def _detection(name: str, size: int):
    """A torchvision detector on one ``size`` x ``size`` image, ending in its NonMaxSuppression:
    boxes, scores and labels of the detections kept (as many as the data decides)."""
    def build():
        import torch
        import torchvision

        _nms_in_onnx_form(torch)
        detector = torchvision.models.get_model(name, weights=None, weights_backbone=None)

        class FirstImage(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.detector = detector

            def forward(self, image):
                found = self.detector([image[0]])[0]
                return found["boxes"], found["scores"], found["labels"]

        return FirstImage(), (torch.rand(1, 3, size, size),), ["image"], ["boxes", "scores", "labels"], {}
    return build


def _nms_in_onnx_form(torch) -> None:
    """torchvision's batched NMS with the ONNX form torchvision's own exporter gives it
    (NonMaxSuppression, its selected boxes' third column), computed in Python: a torchvision wheel
    built for another CUDA than the installed torch has no C++ ``nms`` to trace."""
    from torchvision.ops import boxes as box_ops

    class NMS(torch.autograd.Function):
        @staticmethod
        def forward(ctx, boxes, scores, iou):
            order = scores.argsort(descending=True)
            suppressed = torch.zeros(len(order), dtype=torch.bool)
            keep = []
            for i in range(len(order)):
                if not suppressed[i]:
                    keep.append(order[i])
                    suppressed |= box_ops.box_iou(boxes[order[i]][None], boxes[order])[0] > iou
            return torch.stack(keep) if keep else torch.zeros(0, dtype=torch.long)

        @staticmethod
        def symbolic(g, boxes, scores, iou):
            def const(value, dtype=torch.long):
                return g.op("Constant", value_t=torch.tensor(value, dtype=dtype))
            selected = g.op("NonMaxSuppression", g.op("Unsqueeze", boxes, const([0])),
                            g.op("Unsqueeze", scores, const([0, 1])), const([2**63 - 1]),
                            const([iou], torch.float))
            return g.op("Squeeze", g.op("Gather", selected, const([2]), axis_i=1), const([1]))

    def batched_nms(boxes, scores, idxs, iou_threshold):
        offsets = idxs.to(boxes) * (boxes.max() + torch.tensor(1).to(boxes))
        return NMS.apply(boxes + offsets[:, None], scores, float(iou_threshold))

    box_ops.batched_nms = batched_nms


def _timm(name: str):
    """A timm architecture at its default input size."""
    def build():
        import timm
        import torch

        model = timm.create_model(name, pretrained=False)
        size = model.pretrained_cfg.get("input_size", (3, 224, 224))
        return model, (torch.randn(1, *size),), ["image"], ["logits"], {}
    return build


def _decoder(config_class: str, model_class: str, **config):
    """A Hugging Face decoder-only transformer over 128 tokens: a few layers, hidden 256."""
    def build():
        import torch
        import transformers

        settings = dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=8,
                        num_key_value_heads=2, vocab_size=32000, max_position_embeddings=512, use_cache=False)
        cfg = getattr(transformers, config_class)(**{**settings, **config})
        args, names = _tokens(torch, 128, cfg.vocab_size, mask=False)
        return getattr(transformers, model_class)(cfg), args, names, ["last_hidden_state"], \
            {"input_ids": cfg.vocab_size}
    return build


def _wav2vec2():
    import torch
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    config = Wav2Vec2Config(num_hidden_layers=4)  # base: conv feature encoder over raw audio, hidden 768
    return Wav2Vec2Model(config), (torch.randn(1, 16000),), ["audio"], ["last_hidden_state"], {}


def _whisper_encoder():
    import torch
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    config = WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536)  # tiny
    return WhisperEncoder(config), (torch.randn(1, 80, 3000),), ["features"], ["last_hidden_state"], {}


def _t5_encoder():
    import torch
    from transformers import T5Config, T5EncoderModel

    config = T5Config(d_model=256, d_kv=32, d_ff=1024, num_layers=4, num_heads=8)
    args, names = _tokens(torch, 128, config.vocab_size, mask=False)
    return T5EncoderModel(config), args, names, ["last_hidden_state"], {"input_ids": config.vocab_size}


# Families beyond the zoo's, for benchmarks/families.py: the forms they use (TF's "same" padding,
# pooling and MLPs as token mixers, norms over spatial axes, attention over other axes, RMSNorm,
# rotary embeddings, grouped-query attention, 1-D convolutions over audio, LSTMs as token mixers,
# torch's fold (Col2Im), a 21,841-class head) are what a compiler
# tuned on the zoo meets next.
FAMILIES: dict[str, Export] = {
    **{name: Export(_timm(name), dynamo=True) for name in (
        "tf_efficientnetv2_b0", "mixnet_s", "ghostnet_100", "repvgg_a0", "poolformer_s12", "mobilevit_xs",
        "levit_128s", "deit_tiny_patch16_224", "rexnet_100", "hrnet_w18_small", "dla34", "dpn68",
        "efficientformer_l1", "edgenext_xx_small", "mobilenetv4_conv_small", "fastvit_t8", "ese_vovnet19b_dw",
        "xcit_nano_12_p16_224", "convnextv2_atto", "pit_ti_224", "mixer_s16_224", "gcvit_xxtiny", "cspresnet50",
        "res2net50_14w_8s", "tiny_vit_5m_224", "sequencer2d_s", "volo_d1_224")},
    "llama": Export(_decoder("LlamaConfig", "LlamaModel"), dynamo=True),
    "qwen2": Export(_decoder("Qwen2Config", "Qwen2Model"), dynamo=True),
    "gemma": Export(_decoder("GemmaConfig", "GemmaModel", head_dim=32), dynamo=True),
    "wav2vec2": Export(_wav2vec2, dynamo=True),
    "whisper_encoder": Export(_whisper_encoder, dynamo=True),
    "t5_encoder": Export(_t5_encoder, dynamo=True),
}

EXPORTS: dict[str, Export] = {
    "bert": Export(_bert, dynamo=False),
    "bert_op23": Export(_bert_attention_op23, dynamo=True, opset=23),
    "gpt2": Export(_gpt2, dynamo=True),  # TorchScript cannot export transformers 5's mask code (aten::diff)
    "gpt2_lm": Export(_gpt2_lm, dynamo=True),  # with its language-model head: logits over 50,257 tokens
    "distilbert": Export(_distilbert, dynamo=False),
    "vit_b16": Export(_vit, dynamo=True),
    **{name: Export(_torchvision(name), dynamo=False) for name in (
        "efficientnet_b0", "mobilenet_v3_large", "convnext_tiny", "regnet_y_400mf", "shufflenet_v2_x1_0",
        "resnet18", "lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large",
        # more of the same families: groups of 4 channels, inception concats, inverted residuals,
        # RegNetX's group-16 convs, ShuffleNetV2's 24-channel halves
        "resnext50_32x4d", "googlenet", "mobilenet_v2", "regnet_x_400mf", "shufflenet_v2_x0_5",
        # shifted-window attention: TVM's importer alone cannot import its export
        "swin_t")},
    # exported with dynamic dims, as served: one artifact for every batch size and sequence length
    "bert_dynamic": Export(_bert, dynamo=False, dynamic=("batch", "sequence")),
    "gpt2_dynamic": Export(_gpt2, dynamo=True, dynamic=("batch", "sequence")),
    "vit_b16_dynamic": Export(_vit, dynamo=True, dynamic=("batch",)),
    "llama_dynamic": Export(_decoder("LlamaConfig", "LlamaModel"), dynamo=True, dynamic=("batch", "sequence")),
    **{f"{name}_dynamic": Export(_torchvision(name), dynamo=False, dynamic=("batch",))
       for name in ("resnet50", "mobilenet_v3_large")},
    # more families with dynamic dims: relative position buckets (T5), grouped-query attention
    # (Qwen2), 1-D convolutions over audio features (Whisper), a TorchScript encoder (DistilBERT)
    "distilbert_dynamic": Export(_distilbert, dynamo=False, dynamic=("batch", "sequence")),
    "t5_encoder_dynamic": Export(_t5_encoder, dynamo=True, dynamic=("batch", "sequence")),
    "qwen2_dynamic": Export(_decoder("Qwen2Config", "Qwen2Model"), dynamo=True, dynamic=("batch", "sequence")),
    "whisper_encoder_dynamic": Export(_whisper_encoder, dynamo=True, dynamic=("batch",)),
    # a detector ending in NonMaxSuppression: its post-processing runs on an external backend
    "ssdlite320_mobilenet_v3_large": Export(_detection("ssdlite320_mobilenet_v3_large", 320), dynamo=False),
    **FAMILIES,
}


def _one_output(model):
    """``model`` wrapped so that the export returns one tensor: a transformer's last hidden state or a
    language model's logits, a segmentation net's ``out``, a classifier's logits."""
    import torch

    class OneOutput(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args):
            result = self.model(*args)
            for name in ("last_hidden_state", "logits"):
                if hasattr(result, name):
                    return getattr(result, name)
            return result["out"] if isinstance(result, dict) else result

    return OneOutput()


def drop_provenance(model: onnx.ModelProto) -> None:
    """Drop what the dynamo exporter says of each node's origin (stack traces with this machine's
    paths, module names): nine tenths of a light file's bytes, and nothing a compiler reads."""
    for graph in [model.graph, *(f for f in model.functions)]:
        for node in graph.node:
            del node.metadata_props[:]


def export(name: str, out_dir: str, seed: int = 0) -> str:
    """Export ``name`` and write its light form to ``out_dir``; returns the path."""
    import torch

    torch.manual_seed(seed)
    spec = EXPORTS[name]
    model, args, input_names, output_names, input_high = spec.build()
    model = _one_output(model.eval())
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{name}.onnx")
        with torch.no_grad():
            axes = {name: {DYNAMIC_AXES[dim]: dim for dim in spec.dynamic} for name in input_names}
            if "batch" in spec.dynamic:  # an example batch of 1 would be specialised to 1
                args = tuple(torch.cat([a, a]) for a in args)
            if spec.dynamo:
                dims = {dim: torch.export.Dim(dim) for dim in spec.dynamic}
                shapes = (tuple({axis: dims[dim] for axis, dim in axes[name].items()} for name in input_names),) \
                    if spec.dynamic else None  # one entry: the wrapper's *args
                program = torch.onnx.export(model, args, dynamo=True, opset_version=spec.opset,
                                            input_names=input_names, output_names=output_names,
                                            dynamic_shapes=shapes)
                program.save(path, external_data=True)  # as users get it: weights in a .data file
            else:
                torch.onnx.export(model, args, path, dynamo=False, opset_version=17,
                                  input_names=input_names, output_names=output_names,
                                  dynamic_axes=axes if spec.dynamic else None)
        full = onnx.load(path)  # reads the external data file too
    drop_provenance(full)
    light = models.make_light(full, source=f"{type(model.model).__name__} exported by "
                              f"{f'dynamo (opset {spec.opset})' if spec.dynamo else 'TorchScript (opset 17)'}, "
                              f"torch {torch.__version__}", input_high=input_high)
    target = os.path.join(out_dir, f"{name}.onnx")
    onnx.save(light, target)
    return target


def export_command(argv: list[str] | None, description: str, names: list[str],
                   export_one: Callable[[str, str], str]) -> int:
    """The command line of an exporter: ``names`` (default all) exported into ``--out``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("names", nargs="*", default=names, choices=names, metavar="NAME",
                        help=f"models (default: {' '.join(names)})")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(models.__file__), "zoo"))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for name in args.names:
        path = export_one(name, args.out)
        print(f"wrote {path} ({os.path.getsize(path) / 1e3:.0f} kB)")
    return 0


def main(argv: list[str] | None = None) -> int:
    return export_command(argv, __doc__.splitlines()[0], list(EXPORTS), export)


if __name__ == "__main__":
    sys.exit(main())
