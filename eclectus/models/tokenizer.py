"""Tokenizer: a model directory's ``tokenizer.json`` as a stock server uses it.

A prompt is tokenized whole, as transformers' ``tokenizer(text)`` and vLLM do: with
``add_special_tokens`` (a completion prompt) BOS comes first when the tokenizer config says
so; without (a chat prompt, whose template renders its own specials, as vLLM's
``/v1/chat/completions`` tokenizes it) the text's ids alone. A prompt given as pieces (a
template's constants and values) is the concatenation of their texts, tokenized once, so BPE
merges cross the seams exactly as they would for a client that sent the flat text;
:meth:`Tokenizer.encode_pieces` also says, for each seam, how many of those ids lie wholly
before it (a token that straddles a seam is not counted), from the tokenizer's own character
offsets of the same encode. Decoding skips special tokens unless asked not to.
:class:`IncrementalDetokenizer` turns a stream of generated ids into safe text pieces.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tokenizers

from eclectus.protocol.chat_template import DEFAULT_CHAT_TEMPLATE, render_chat

REPLACEMENT_CHAR = "\ufffd"  # what a decoder emits for incomplete or invalid UTF-8


class Tokenizer:
    """Wraps a ``tokenizers.Tokenizer``. Immutable after construction; all methods are pure."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        bos_token_id: int | None,
        eos_token_ids: tuple[int, ...],
        chat_template: str | None,
        special_tokens: dict[str, str],
    ) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id  # None: prompts start without BOS (e.g. Qwen2)
        self.eos_token_ids = eos_token_ids
        self.chat_template = chat_template  # None: DEFAULT_CHAT_TEMPLATE is used
        self._special_tokens = special_tokens  # "bos_token" -> "<s>" etc., for templates
        self.stream_hold_ids = _stream_hold_ids(backend)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load ``tokenizer.json`` with ``tokenizer_config.json`` (specials, chat template,
        add_bos_token), ``chat_template.jinja`` and the EOS ids of ``config.json`` and
        ``generation_config.json`` when present."""
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise ValueError(
                f"no tokenizer.json in {path}: only fast (tokenizers) tokenizers are supported"
            )
        backend = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        tok_config = _read_json(path / "tokenizer_config.json")
        special = {
            k: t
            for k in ("bos_token", "eos_token", "pad_token", "unk_token")
            if (t := _token_text(tok_config.get(k))) is not None
        }
        bos_id = _bos_id(backend, tok_config, special.get("bos_token"))
        eos_ids: list[int] = []
        eos_text = special.get("eos_token")
        if eos_text is not None and backend.token_to_id(eos_text) is not None:
            eos_ids.append(backend.token_to_id(eos_text))
        for extra in ("config.json", "generation_config.json"):
            value = _read_json(path / extra).get("eos_token_id")
            for i in value if isinstance(value, list) else [] if value is None else [value]:
                if int(i) not in eos_ids:
                    eos_ids.append(int(i))
        return cls(backend, bos_id, tuple(eos_ids), _chat_template(path, tok_config), special)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` as transformers' ``tokenizer(text, add_special_tokens=...)``
        gives them: BOS first when ``add_special_tokens`` and the tokenizer adds one (a BOS
        the text itself renders is kept too, as transformers keeps it). Pure; long texts
        release the GIL (:meth:`_encode_ids`)."""
        return self._with_bos(self._encode_ids(text), add_special_tokens)

    def encode_pieces(
        self, pieces: Sequence[str], add_special_tokens: bool = True
    ) -> tuple[list[int], list[int]]:
        """The ids :meth:`encode` gives for ``"".join(pieces)``, and for each piece the count
        of those ids lying wholly before its end (BOS included): a prefix that other prompts
        with the same leading pieces can share ends there at the latest. A token that
        straddles a seam counts for the piece after it. Pure."""
        text = "".join(pieces)
        if len(pieces) <= 1:  # no seam: nothing to place, no offsets needed
            ids = self.encode(text, add_special_tokens)
            return ids, [len(ids)] * len(pieces)
        encoding = self.backend.encode_batch([text], add_special_tokens=False)[0]
        ids = self._with_bos(encoding.ids, add_special_tokens)
        first = len(ids) - len(encoding.ids)  # the BOS lies before every seam
        # a token's end, as the furthest character any token up to it reaches (byte tokens
        # of one character share its offsets; the running maximum keeps the list sorted)
        reach = list(itertools.accumulate((end for _, end in encoding.offsets), max))
        seams = itertools.accumulate(len(piece) for piece in pieces)
        return ids, [first + bisect.bisect_right(reach, seam) for seam in seams]

    def _encode_ids(self, text: str) -> list[int]:
        """The text's ids, no specials added (pure). ``encode_batch_fast``: unlike
        ``encode``, it releases the GIL while it runs (a 2,000-token prompt takes ~1.5 ms),
        so the server's event loop and the engine's step thread keep running meanwhile; and
        it skips the character offsets (~25% less CPU; the ids are the same)."""
        return self.backend.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def _with_bos(self, ids: list[int], add_special_tokens: bool) -> list[int]:
        if add_special_tokens and self.bos_token_id is not None:
            return [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``, special tokens skipped unless ``skip_special_tokens`` is False.
        Incomplete UTF-8 decodes to U+FFFD (pure)."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """Render ``messages`` ([{"role", "content"}]) with the directory's Jinja chat template,
        as transformers does, or with DEFAULT_CHAT_TEMPLATE. The result is a prompt string to
        :meth:`encode` with ``add_special_tokens=False``, as vLLM's chat endpoint does: the
        template renders whatever specials the model expects."""
        return render_chat(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            template_vars=self._special_tokens,
        )

    @property
    def effective_chat_template(self) -> str:
        """The template source :meth:`apply_chat_template` renders with."""
        return self.chat_template or DEFAULT_CHAT_TEMPLATE

    @property
    def template_vars(self) -> dict[str, str]:
        """The special-token strings templates use ("bos_token" -> "<s>"...), a copy."""
        return dict(self._special_tokens)


class IncrementalDetokenizer:
    """Decode a stream of generated ids into text pieces that are safe to emit.

    Feed ids one at a time; a piece is held back while the text ends in U+FFFD (an incomplete
    multi-byte character), and, for byte-fallback tokenizers, while the last id is in
    ``tokenizer.stream_hold_ids``. The concatenation of every piece returned by :meth:`feed`
    and then :meth:`flush` equals ``tokenizer.decode(all ids)``.

    Why a window: decoding only ``ids[prefix_offset:]`` keeps each step O(window), and
    re-decoding the previously emitted tokens with the new ones (then diffing) keeps
    tokenizers whose decoders depend on the neighbouring token (sentencepiece's leading
    space) correct. Both offsets only move to a point where the text so far was complete.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the decode window
        self._read_offset = 0  # ids before this are already emitted

    @property
    def token_ids(self) -> list[int]:
        """All ids fed so far (a copy)."""
        return list(self._ids)

    def feed(self, token_id: int) -> str:
        """Add one id (mutates); return the newly safe text, possibly ""."""
        self._ids.append(token_id)
        if token_id in self._tokenizer.stream_hold_ids:
            return ""
        prefix_text, text = self._window_texts()
        if len(text) > len(prefix_text) and not text.endswith(REPLACEMENT_CHAR):
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            return text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """Return whatever is still held back, even if incomplete (mutates: marks it emitted)."""
        prefix_text, text = self._window_texts()
        self._prefix_offset = self._read_offset = len(self._ids)
        return text[len(prefix_text) :]

    def _window_texts(self) -> tuple[str, str]:
        skip = self._skip_special_tokens
        window = self._ids[self._prefix_offset :]
        emitted = self._read_offset - self._prefix_offset
        decode = self._tokenizer.decode
        return decode(window[:emitted], skip), decode(window, skip)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _token_text(value: str | dict[str, Any] | None) -> str | None:
    """A special token from tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _stream_hold_ids(backend: tokenizers.Tokenizer) -> frozenset[int]:
    """Ids after which a text stream must wait for an ordinary token (pure).

    Only byte-fallback decoders (Llama 2, Mistral) need this: they decode a whole run of
    ``<0xNN>`` tokens at once and, if the run is not valid UTF-8, turn *every* byte of it into
    U+FFFD, so a valid prefix of the run cannot be emitted early. Skipped special tokens
    inside a run do not end it, so they wait too.
    """
    decoder = backend.decoder
    if decoder is None or b'"ByteFallback"' not in decoder.__getstate__():
        return frozenset()
    byte_ids = {
        i
        for token, i in backend.get_vocab(with_added_tokens=False).items()
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">")
    }
    special_ids = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    return frozenset(byte_ids | special_ids)


def _bos_id(
    backend: tokenizers.Tokenizer, tok_config: dict[str, Any], bos_text: str | None
) -> int | None:
    """BOS id if prompts start with it: tokenizer_config's add_bos_token when present, else
    whether tokenizer.json's post-processor adds it (Llama 3 does; Qwen2 has no BOS)."""
    bos_id = None if bos_text is None else backend.token_to_id(bos_text)
    if bos_id is None:
        return None
    if "add_bos_token" in tok_config:
        return bos_id if tok_config["add_bos_token"] else None
    adds = backend.encode("", add_special_tokens=True).ids[:1] == [bos_id]
    return bos_id if adds else None


def _chat_template(path: Path, tok_config: dict[str, Any]) -> str | None:
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name", "template"}]
        named = {t["name"]: t["template"] for t in template}
        return named.get("default")
    return template
