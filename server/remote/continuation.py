"""A request's text after a failover, decoded here from the engines' token ids.

Each engine detokenizes only what it generated. Continuing a request on a second engine
would otherwise lose or garble text at the seam: the first engine may have held back the
first bytes of a multi-byte character (their ids arrived, their text never did), and the
second engine decodes its first ids without the bytes before them. So from the failover on,
the text is decoded locally from *all* generated ids (the same tokenizer, checked at the
handshake): :class:`LocalText` is primed with the ids streamed so far, checks that its text
continues what the graph already received, and then turns every new id into text, holding
back a possible stop string's prefix and ending at a stop string as the engines do (a stop
string is not part of the output).
"""

from __future__ import annotations

from collections.abc import Iterable

from eclectus.models.tokenizer import IncrementalDetokenizer, Tokenizer


class LocalText:
    """Text for one request's ids from a failover on (mutable; one per request)."""

    def __init__(self, detokenizer: IncrementalDetokenizer, held: str, stop: tuple[str, ...]):
        self._detokenizer = detokenizer
        self._held = held  # decoded but not yet emitted
        self._stop = stop
        self._hold_back = max((len(s) for s in stop), default=1) - 1

    @classmethod
    def resume(
        cls, tokenizer: Tokenizer, token_ids: list[int], emitted: str, stop: tuple[str, ...]
    ) -> LocalText | None:
        """Prime a detokenizer with ``token_ids``; None when its text does not continue
        ``emitted`` (the text the graph received), so the caller keeps the engines' text."""
        detokenizer = IncrementalDetokenizer(tokenizer)
        text = "".join(detokenizer.feed(i) for i in token_ids)
        if not text.startswith(emitted):
            return None
        return cls(detokenizer, text[len(emitted) :], stop)

    def feed(self, token_ids: Iterable[int]) -> tuple[str, bool]:
        """Decode new ids (mutates): (text safe to emit, whether a stop string ended it)."""
        for token_id in token_ids:
            self._held += self._detokenizer.feed(token_id)
        return self._release(final=False)

    def flush(self) -> tuple[str, bool]:
        """The stream ended (mutates): everything still held, up to a stop string."""
        self._held += self._detokenizer.flush()
        return self._release(final=True)

    def _release(self, final: bool) -> tuple[str, bool]:
        found = [i for i in (self._held.find(s) for s in self._stop) if i >= 0]
        if found:
            text, self._held = self._held[: min(found)], ""
            return text, True
        keep = 0 if final else self._hold_back
        cut = len(self._held) - keep
        if cut <= 0:
            return "", False
        text, self._held = self._held[:cut], self._held[cut:]
        return text, False
