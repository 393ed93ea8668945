"""The LangChain adapter's exceptions."""

from __future__ import annotations


class EclectusLangChainError(Exception):
    """Base of this package's errors."""


class NotLowerable(EclectusLangChainError):
    """A runnable (or a template feature) cannot run on the server as given.

    The compiler answers with a client-side cut; the tracing hook answers by sending the
    prompt as one flat text. ``reason`` says why, for the printed graph.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
