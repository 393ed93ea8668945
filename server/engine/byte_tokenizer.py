"""The byte-level tokenizer of the built-in presets, built with the ``tokenizers`` library.

Token id ``b`` is the byte ``b`` (0..255); specials follow: ``<s>`` 256 (BOS, added at the
start by the post-processor), ``</s>`` 257 (EOS), ``<pad>`` 258, ``<unk>`` 259 (never produced:
every byte has a token), then ``<|reserved_N|>`` up to ``vocab_size`` so the tokenizer covers
the model's whole (64-aligned) embedding table.

It is a BPE with no merges behind a ByteLevel pre-tokenizer with ``use_regex=False`` and
``add_prefix_space=False``: the text is never split or altered, so tokenizing segments
separately and concatenating the ids equals tokenizing the concatenated text (unless a special
token's literal text, such as ``<s>``, straddles a boundary: like transformers, we match such
literals as special tokens).
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from eclectus.protocol.chat_template import DEFAULT_CHAT_TEMPLATE

NUM_BYTES = 256
BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
BOS_ID, EOS_ID, PAD_ID, UNK_ID = 256, 257, 258, 259

# The default chat template lives in eclectus/protocol/chat_template.py (re-exported here).


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, the alphabet of the ByteLevel pre-tokenizer.

    Printable Latin-1 bytes map to themselves; the rest to code points from 256 upwards.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(NUM_BYTES):
        if b not in mapping:
            mapping[b] = chr(NUM_BYTES + extra)
            extra += 1
    return mapping


def build_byte_tokenizer(vocab_size: int) -> Tokenizer:
    """A fresh byte-level tokenizer with ``vocab_size`` ids in all (pure)."""
    if vocab_size < UNK_ID + 1 or vocab_size % 64:
        raise ValueError(f"vocab_size must be a multiple of 64 and > {UNK_ID}, got {vocab_size}")
    vocab = {char: b for b, char in bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = [BOS, EOS, PAD, UNK] + [f"<|reserved_{i}|>" for i in range(vocab_size - UNK_ID - 1)]
    # added in order, so they take ids 256, 257, ... after the 256 byte tokens
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, BOS_ID)]
    )
    assert tokenizer.token_to_id(BOS) == BOS_ID and tokenizer.get_vocab_size() == vocab_size
    return tokenizer


def byte_tokenizer_config(model_max_length: int) -> dict[str, Any]:
    """tokenizer_config.json for transformers' AutoTokenizer (pure)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,  # decode must give back the exact bytes
        "model_max_length": model_max_length,
        "chat_template": DEFAULT_CHAT_TEMPLATE,
    }
