"""The BPE tokenizer of the built-in presets, trained with the ``tokenizers`` library.

Byte-level BPE as GPT-2 (the ByteLevel pre-tokenizer with its regex: words, numbers and
punctuation runs are split apart, a leading space belongs to the word after it), trained on
the ``tiny`` corpus to :data:`VOCAB_SIZE` ids. Ids 0-6 are the special tokens of
:mod:`.tiny_chat` (``<pad>`` 0, ``<s>`` 1 BOS, ``</s>`` 2 EOS, then the four role markers),
7-8 are ``<tool_call>`` and ``</tool_call>`` (added but not special, so decoding keeps them),
then the 256 byte tokens, then the merges. Every string encodes (no unknown token). BOS is
added by the post-processor (and ``add_bos_token``), so transformers' ``AutoTokenizer`` gives
the ids the engine gives.

Training is deterministic (the trainer breaks ties between equally frequent pairs by the
pair itself); ``train_tiny`` runs it and commits the result as ``tiny/tokenizer.json``, so
nothing is trained at install or run time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from eclectus.models.tiny_chat import (
    BOS,
    BOS_ID,
    CHAT_TEMPLATE,
    EOS,
    PAD,
    SPECIAL_TOKENS,
    TOOL_CALL_TOKENS,
)

VOCAB_SIZE = 2048  # a multiple of 64, the embedding table's rows

_ADDED = (*SPECIAL_TOKENS, *TOOL_CALL_TOKENS)
_SPLIT_ADDED = re.compile("|".join(re.escape(t) for t in _ADDED))


def train_tokenizer(docs: Sequence[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """A byte-level BPE trained on ``docs`` with ``vocab_size`` ids in all (pure)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(_ADDED),  # ids 0.. in this order
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_plain_pieces(docs), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, BOS_ID)]
    )
    state = json.loads(tokenizer.to_str())
    for added in state["added_tokens"]:  # the trainer marks all of them special
        added["special"] = added["content"] not in TOOL_CALL_TOKENS
    tokenizer = Tokenizer.from_str(json.dumps(state))
    assert [tokenizer.token_to_id(t) for t in _ADDED] == list(range(len(_ADDED)))
    assert tokenizer.get_vocab_size() == vocab_size, tokenizer.get_vocab_size()
    return tokenizer


def _plain_pieces(docs: Sequence[str]) -> Iterator[str]:
    """The text between added tokens: they are matched whole, never learned as merges."""
    for doc in docs:
        yield from (piece for piece in _SPLIT_ADDED.split(doc) if piece)


def tokenizer_config(model_max_length: int) -> dict[str, Any]:
    """tokenizer_config.json for transformers' AutoTokenizer and vLLM (pure)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,  # decode must give back the exact text
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
