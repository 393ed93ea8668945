"""Per-request text: incremental detokenization, stop checks, and deltas that never leak a
stop string."""

from __future__ import annotations

from collections.abc import Sequence

from eclectus.models.tokenizer import IncrementalDetokenizer, Tokenizer
from eclectus.protocol.sampling import SamplingParams
from eclectus.server.engine.sequence import FinishReason


class OutputState:
    """The text side of one request. Mutated by :meth:`append_token`, :meth:`flush` and
    :meth:`take_delta`.

    ``text`` is the output so far: stop and EOS tokens add no text and a matched stop string
    is cut off. Deltas handed out by :meth:`take_delta` concatenate to the final ``text``.
    """

    def __init__(self, sampling: SamplingParams, tokenizer: Tokenizer) -> None:
        self.sampling = sampling
        self._stop_ids = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            self._stop_ids.update(tokenizer.eos_token_ids)
        self._detokenizer = IncrementalDetokenizer(tokenizer, sampling.skip_special_tokens)
        self._max_stop_len = max((len(s) for s in sampling.stop), default=0)
        self.text = ""
        self._stopped_by_string = False
        self._num_emitted_chars = 0
        self._num_emitted_tokens = 0

    def append_token(self, token_id: int) -> FinishReason | None:
        """Account for one sampled token; returns STOP when it ends the request (mutates)."""
        if token_id in self._stop_ids:
            return FinishReason.STOP
        return self._add_text(self._detokenizer.feed(token_id))

    def flush(self) -> FinishReason | None:
        """At the end of a request, add text held back as incomplete (mutates)."""
        if self._stopped_by_string:
            return None
        return self._add_text(self._detokenizer.flush())

    def _add_text(self, delta: str) -> FinishReason | None:
        if not delta:
            return None
        start = max(0, len(self.text) - self._max_stop_len + 1)  # a match may straddle
        self.text += delta
        hits = [i for i in (self.text.find(stop, start) for stop in self.sampling.stop) if i >= 0]
        if not hits:
            return None
        self.text = self.text[: min(hits)]  # the earliest match wins
        self._stopped_by_string = True
        return FinishReason.STOP

    def _holdback(self) -> int:
        """Length of the longest tail of ``text`` that could start a stop string (pure)."""
        for n in range(min(self._max_stop_len - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(stop.startswith(tail) for stop in self.sampling.stop):
                return n
        return 0

    def take_delta(
        self, token_ids: Sequence[int], num_prompt_tokens: int, finished: bool
    ) -> tuple[str, tuple[int, ...]]:
        """Text and output token ids not handed out yet (mutates the emission marks).
        ``token_ids`` is prompt + output; only the new tail is copied. Until the request
        finishes, text that might begin a stop string is held back."""
        end = len(self.text) if finished else len(self.text) - self._holdback()
        end = max(end, self._num_emitted_chars)
        text = self.text[self._num_emitted_chars : end]
        tokens = tuple(token_ids[num_prompt_tokens + self._num_emitted_tokens :])
        self._num_emitted_chars = end
        self._num_emitted_tokens = len(token_ids) - num_prompt_tokens
        return text, tokens
