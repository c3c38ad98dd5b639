"""A stand-in tokenizer for decoders with random weights: byte-level (every text encodes, every id
decodes), with a ChatML chat template and an EOS token, written as a checkpoint's tokenizer files.

Ids 0-255 are the bytes (GPT-2's byte-to-character map), then ``<|endoftext|>`` (EOS),
``<|im_start|>`` and ``<|im_end|>``, then ``<|extra_N|>`` up to the decoder's vocabulary, so whatever a
decoder draws decodes to text. Made offline by the ``tokenizers`` package; used by the serving tests
and benchmarks, never shipped as a model's own.
"""

from __future__ import annotations

import json
import os

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def write(directory: str, vocab: int, chat_template: bool = True) -> str:
    """``tokenizer.json`` and ``tokenizer_config.json`` for ``vocab`` ids in ``directory``; returns it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    by_byte = sorted(alphabet, key=lambda c: _byte_of(c))
    if vocab < 256 + len(SPECIAL):
        raise ValueError(f"a byte-level tokenizer needs at least {256 + len(SPECIAL)} ids, not {vocab}")
    table = {char: i for i, char in enumerate(by_byte)}
    tokenizer = Tokenizer(models.BPE(vocab=table, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL))
    tokenizer.add_tokens([f"<|extra_{i}|>" for i in range(vocab - 256 - len(SPECIAL))])
    os.makedirs(directory, exist_ok=True)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    config = {"eos_token": SPECIAL[0], "bos_token": None, "model_max_length": 1 << 20}
    if chat_template:
        config["chat_template"] = CHATML
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as file:
        json.dump(config, file, indent=1)
    return directory


def _byte_of(char: str) -> int:
    """The byte GPT-2's byte-level map writes as ``char``."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    code = ord(char)
    return code if code in printable else others[code - 256]
