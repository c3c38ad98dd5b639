"""OpenVINO GenAI's continuous batching on a checkpoint of the serving benchmark's architecture, run in a
side virtualenv of its own (never imported by relaxc or its tests):

    python -m venv ov && ov/bin/pip install openvino-genai "optimum-intel[openvino]" "transformers<5.6" torch
    ov/bin/python benchmarks/openvino_serving.py --out DIR --vocab 32000 --clients 1 4 8 --prompt 32 --tokens 64

Makes the Llama-class checkpoint with random weights (``benchmarks/export_decoders.py``'s
``llama_125m_past`` configuration) and the stand-in tokenizer the relaxc side serves with, exports it with
optimum-intel (fp32), checks that OpenVINO GenAI's greedy tokens for a prompt are transformers' own, then
times ``ContinuousBatchingPipeline`` (2 threads, fp32 compute and cache as relaxc's) on N requests given together: prints one JSON line,
tokens per second from the start to the last token, per number of clients (median of ``--repeat``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

LLAMA_125M = dict(num_hidden_layers=12, hidden_size=768, intermediate_size=2048, num_attention_heads=12,
                  num_key_value_heads=4, max_position_embeddings=2048)


def checkpoint(out: str, vocab: int, tokenizer_dir: str) -> str:
    """The checkpoint (random weights, seed 0) and its tokenizer in ``out/hf``; exported to ``out/ov``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    hf, ov = os.path.join(out, "hf"), os.path.join(out, "ov")
    if os.path.exists(os.path.join(ov, "openvino_model.xml")):
        return ov
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, eos_token_id=256, bos_token_id=None, **LLAMA_125M))
    model.save_pretrained(hf)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(tokenizer_dir, "tokenizer.json"),
                                        eos_token="<|endoftext|>")
    tokenizer.save_pretrained(hf)
    from optimum.intel import OVModelForCausalLM

    exported = OVModelForCausalLM.from_pretrained(hf, export=True, load_in_8bit=False, compile=False)
    exported.save_pretrained(ov)
    from openvino_tokenizers import convert_tokenizer
    import openvino

    encoder, decoder = convert_tokenizer(tokenizer, with_detokenizer=True)
    openvino.save_model(encoder, os.path.join(ov, "openvino_tokenizer.xml"))
    openvino.save_model(decoder, os.path.join(ov, "openvino_detokenizer.xml"))
    tokenizer.save_pretrained(ov)
    return ov


def check(hf: str, pipeline, prompt: list[int], tokens: int) -> None:
    """OpenVINO GenAI's greedy tokens for ``prompt`` are transformers' own on the same checkpoint."""
    import numpy as np
    import openvino as ov
    import openvino_genai
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(hf)
    want = model.generate(torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False)[0, len(prompt):].tolist()
    config = openvino_genai.GenerationConfig(max_new_tokens=tokens, ignore_eos=True)
    got = pipeline.generate([ov.Tensor(np.array([prompt], "int64"))], [config])[0].m_generation_ids[0]
    if list(got) != want:
        raise AssertionError(f"OpenVINO GenAI's greedy tokens differ from transformers': {list(got)[:8]} vs {want[:8]}")


def main(argv: list[str] | None = None) -> int:
    import numpy as np
    import openvino as ov
    import openvino_genai

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokenizer", required=True, help="the stand-in tokenizer's directory")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    folder = checkpoint(args.out, args.vocab, args.tokenizer)
    scheduler = openvino_genai.SchedulerConfig()
    scheduler.max_num_seqs = max(args.clients)
    scheduler.cache_size = 1  # GB of paged cache: room for every request
    fp32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}  # its defaults: bf16 where the CPU has it
    pipeline = openvino_genai.ContinuousBatchingPipeline(folder, scheduler, "CPU",
                                                         {"INFERENCE_NUM_THREADS": args.threads, **fp32})
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, args.vocab, args.prompt - i).tolist() for i in range(max(args.clients))]
    check(os.path.join(args.out, "hf"), pipeline, prompts[0], 16)
    config = openvino_genai.GenerationConfig(max_new_tokens=args.tokens, ignore_eos=True)
    result = {}
    for n in args.clients:
        inputs = [ov.Tensor(np.array([p], "int64")) for p in prompts[:n]]
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            pipeline.generate(inputs, [config] * n)
            times.append(time.perf_counter() - started)
        result[n] = n * args.tokens / statistics.median(times)
    print(json.dumps({"tokens_per_second_end_to_end": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
