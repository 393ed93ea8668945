"""Watching what a real in-process server makes of each call's prompt, for the adapter tests
(a uniquely named module at tests/adapters, importable from every suite below it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from eclectus.server.front.app import EclectusServer
from eclectus.server.graph import runner


class PromptLog(list[tuple[str, ...]]):
    """The prompts the runner built, in order: each one's texts (variables resolved, cut
    where the client cut it; the model reads their concatenation, tokenized once), and in
    ``add_special_tokens`` whether each was a completion prompt (True) or a chat
    template's render (False)."""

    def __init__(self) -> None:
        super().__init__()
        self.add_special_tokens: list[bool] = []


@contextmanager
def engine_prompts(server: EclectusServer, drop_empty: bool = False) -> Iterator[PromptLog]:
    """The prompts of every engine request the server makes while inside (any server of
    this process: the runner is module-level); ``drop_empty``: without their empty texts
    (they add no tokens)."""
    del server  # the runner is the same for every server in the process
    seen = PromptLog()
    original = runner.prompt_segments

    def recording(graph: Any, node: Any, index: int, generated: dict[str, str]) -> Any:
        texts, gen = original(graph, node, index, generated)
        seen.append(tuple(t for t in texts if t or not drop_empty))
        seen.add_special_tokens.append(node.add_special_tokens)
        return texts, gen

    runner.prompt_segments = recording  # type: ignore[assignment]
    try:
        yield seen
    finally:
        runner.prompt_segments = original
