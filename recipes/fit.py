"""Sizes that fit the document and the model: what ``eclectus run`` adapts, or refuses in one
line, before a recipe starts.

A size the user did not give adapts: a document shorter than the default ``num_chunks``
gives fewer chunks, and a default ``system_tokens`` longer than the served model's prompt
limit shrinks to fit; each change comes back as a note. A size the user gave and that
cannot be met is a ValueError that says what to change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from eclectus.recipes.shared_prompt import SYSTEM, SharedPromptParams, questions, split_document
from eclectus.recipes.text import split_chunks

TEMPLATE_SLACK_TOKENS = 64  # the chat template's role markers around system and question
CountTokens = Callable[[str], int]  # the served model's token count of a text


def _flag(path: str) -> str:
    """How the user sets ``path``: a common flag, or ``--param PATH=...`` (pure)."""
    if "." not in path and path in ("num_chunks", "chunk_tokens"):
        return "--" + path.replace("_", "-")
    return f"--param {path}=..."


def fit_num_chunks(params: Any, text: str, path: str, given: bool, notes: list[str]) -> Any:
    """``params`` whose ``num_chunks`` (at the top level when ``path`` is "", else in the
    nested params field ``path``) ``text`` can give: lowered to what it gives when the user
    did not set it (appends a note), else a ValueError naming the flags (pure but for
    ``notes``)."""
    inner = getattr(params, path) if path else params
    if inner is None or inner.num_chunks is None:
        return params
    available = len(split_chunks(text, inner.chunk_tokens))
    if available >= inner.num_chunks:
        return params
    prefix = f"{path}." if path else ""
    if given:
        raise ValueError(
            f"{_flag(prefix + 'num_chunks')} {inner.num_chunks}: the document gives only "
            f"{available} chunk(s) of {inner.chunk_tokens} tokens; ask for {available} or "
            f"fewer, pass a smaller {_flag(prefix + 'chunk_tokens')}, or a longer --input"
        )
    notes.append(
        f"the document gives {available} chunk(s) of {inner.chunk_tokens} tokens, "
        f"not the default {inner.num_chunks}: using {available}"
    )
    fitted = dataclasses.replace(inner, num_chunks=available)
    return dataclasses.replace(params, **{path: fitted}) if path else fitted


def _longest_chat_prompt(params: SharedPromptParams, text: str, count: CountTokens) -> int:
    """Tokens of the longest chat prompt (system prompt, question, template slack) plus the
    answer (pure but for ``count``'s calls)."""
    handbook, _ = split_document(params, text)
    question = max(questions(params, text), key=len)
    system = count(SYSTEM.format(handbook=handbook))
    return system + count(question) + TEMPLATE_SLACK_TOKENS + params.answer_tokens


def fit_system_prompt(
    params: SharedPromptParams,
    text: str,
    max_tokens: int,
    count: CountTokens,
    given: bool,
    notes: list[str],
) -> SharedPromptParams:
    """``params`` whose chat prompt and answer fit ``max_tokens`` (the model's context
    window and the server's prompt limit): ``system_tokens`` shrunk when not ``given``
    (appends a note), else a ValueError saying what fits."""
    needed = _longest_chat_prompt(params, text, count)
    if needed <= max_tokens:
        return params
    fitted = params
    for _ in range(4):  # text tokens and the estimate's bytes differ: close in, a few steps
        scale = max_tokens / _longest_chat_prompt(fitted, text, count)
        if scale >= 1:
            break
        system_tokens = max(8, int(fitted.system_tokens * scale * 0.97))
        fitted = dataclasses.replace(fitted, system_tokens=system_tokens)
    if given:
        raise ValueError(
            f"--param system_tokens={params.system_tokens}: a chat prompt and its answer need "
            f"{needed} tokens, more than the served model takes ({max_tokens}); pass "
            f"--param system_tokens={fitted.system_tokens} or less"
        )
    notes.append(
        f"system_tokens {params.system_tokens} does not fit the served model's {max_tokens} "
        f"tokens with a question and the answer: using {fitted.system_tokens}"
    )
    return fitted
