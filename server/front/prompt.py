"""The front: the one place a prompt's text becomes token ids, and the model as clients see it.

As vLLM's API server renders and tokenizes in front of its EngineCore (which gets
``prompt_token_ids`` only), the front owns the model directory's tokenizer and chat template
and builds the one :class:`ModelCard` the welcome, ``/v1/models`` and the adapters see. The
sessions, ``/v1`` and the remote pool use it; backends take ids (server/backend.py).

**What a prompt's tokens are.** The ids a stock server computes for the same text. A prompt
is the concatenation of its segments' texts (template constants, variable values, earlier
outputs: an output that feeds a later prompt enters it as text), tokenized once:

* a completion prompt (``add_special_tokens``, the default) as transformers'
  ``tokenizer(text)`` does, BOS first when the tokenizer config says so;
* a chat prompt (``add_special_tokens=False``: what every adapter path that renders a chat
  template sends, and ``/v1/chat/completions``) as vLLM's chat endpoint does: the rendered
  template's ids, no special token added beyond what the template renders.

Segment boundaries survive only as token offsets (:attr:`Prompt.prefix_ends`): at each seam,
how many ids lie wholly before it, from the tokenizer's own character offsets of the same
encode (a token that straddles the seam is not counted). A pin for calls that share leading
segments covers those ids; the prefix cache needs no more, since it matches hash-chained full
blocks of whatever ids the prompts have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eclectus.models.presets import resolve_model_dir
from eclectus.models.tokenizer import Tokenizer
from eclectus.protocol import ModelCard
from eclectus.protocol.chat_template import render_chat


@dataclass(frozen=True, slots=True)
class Prompt:
    """A prompt's ids and, per segment, the ids lying wholly before its end (the last one is
    the prompt's length when its last segment ends it). Immutable."""

    token_ids: tuple[int, ...]
    prefix_ends: tuple[int, ...]

    @classmethod
    def of_ids(cls, ids: Sequence[int]) -> Prompt:
        """A prompt given as ids (vLLM's token-id prompts): one segment, as given (pure)."""
        return cls(tuple(ids), (len(ids),))

    def __len__(self) -> int:
        return len(self.token_ids)

    def prefix_tokens(self, num_segments: int) -> int:
        """The ids lying wholly before the end of the first ``num_segments`` segments: how
        many a pin for calls sharing those segments covers (0: none) (pure)."""
        if num_segments <= 0 or not self.prefix_ends:
            return 0
        return self.prefix_ends[min(num_segments, len(self.prefix_ends)) - 1]


class Front:
    """The served model's tokenizer, chat template and card. Immutable after construction;
    every method is pure and safe on any thread (the tokenizer is immutable)."""

    def __init__(self, name: str, tokenizer: Tokenizer) -> None:
        self.name = name  # the --model value: a preset name or a directory
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, model: str) -> Front:
        """The front of ``model`` (a preset, materialised on first use, or a HF directory):
        its tokenizer only, no weights (blocking: reads files). ValueError when the model
        cannot be found or has no ``tokenizer.json``."""
        return cls(model, Tokenizer.from_dir(resolve_model_dir(model)))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def card(self, context_window: int) -> ModelCard:
        """The model as clients see it, given the backend's context window (pure)."""
        eos = self.tokenizer.eos_token_ids
        return ModelCard(
            name=self.name,
            context_window=context_window,
            eos_token_id=eos[0] if eos else None,
            chat_template=self.tokenizer.effective_chat_template,
            template_vars=self.tokenizer.template_vars,
        )

    def encode(self, segments: Sequence[str], add_special_tokens: bool = True) -> Prompt:
        """The prompt whose text is ``"".join(segments)``, tokenized once as the module says
        (pure; releases the GIL while it encodes)."""
        ids, ends = self.tokenizer.encode_pieces(segments, add_special_tokens)
        return Prompt(tuple(ids), tuple(ends))

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """``messages`` rendered with the model's chat template as transformers renders
        them, generation prompt included: a prompt to :meth:`encode` with
        ``add_special_tokens=False`` (pure)."""
        return render_chat(
            self.tokenizer.chat_template,
            messages,
            template_vars=self.tokenizer.template_vars,
            tools=tools,
        )
