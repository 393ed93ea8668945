"""What Eclectus checks before it sends an engine work, at start-up and each time a lost
engine comes back: its model, its context window, that its tokenizer is ours, and whether it
schedules by priority.

The tokenizer check matters because Eclectus sends prompts as token ids (so the segment
boundaries it tokenized are the tokens the engine sees) and the engine decodes what it
generates with its own tokenizer: a different vocabulary would turn every prompt into
garbage without an error. A probe string full of the usual troublemakers (non-ASCII,
digits, whitespace runs, a special token's text) is tokenized here and there and must give
the same ids. Engines without a tokenize endpoint get a weaker check: the prompt's token
count as the engine reports it in ``usage``.

Token-id prompts need both halves: an exact tokenizer check (a ``/tokenize`` that agrees)
and a ``/v1/completions`` that takes a list of ids. An engine lacking either gets text
prompts (the prompt's ids decoded), tokenized by the engine itself: safe with a vocabulary
the weak check could not prove (docs/engines.md).

Structured outputs: the engine's dialect (dialect.py) is found by behaviour, a one-choice
constraint per dialect, since every engine family ignores request fields it does not know.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from eclectus.models.tokenizer import Tokenizer
from eclectus.server.remote.client import EngineClient
from eclectus.server.remote.dialect import (
    PROBE_CHOICE,
    PROBE_ORDER,
    Dialect,
    constraint_fields,
    probe_choice,
)
from eclectus.server.remote.errors import EngineDown, EngineRejected, RemoteStartError

log = logging.getLogger(__name__)

PROBE = "Eclectus probe: héllo wörld, 你好 🙂 <s> 12345  \n\tdef f(x): return x**2\n"


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the handshake learnt. ``model_id``: the name requests carry; ``max_model_len``:
    the engine's context window (None: it does not say); ``priority``: it accepts a request
    ``priority`` (vLLM with ``--scheduling-policy priority``); ``token_prompts``: prompts go
    as token ids (else as text); ``dialect``: how it takes structured outputs; ``sglang``:
    it is SGLang (it serves ``/get_model_info``), whose priority runs the other way and whose
    requests take an ``rid``."""

    model_id: str
    max_model_len: int | None
    priority: bool
    token_prompts: bool = True
    dialect: Dialect = Dialect.VLLM
    sglang: bool = False


async def handshake(client: EngineClient, tokenizer: Tokenizer) -> EngineInfo:
    """Check the engine at ``client`` (network only). EngineDown: it cannot be reached;
    RemoteStartError: it serves something Eclectus must not use."""
    models = await client.models()
    if not models:
        raise RemoteStartError(f"engine {client.url} serves no model (GET /v1/models is empty)")
    if len(models) > 1:
        log.warning("engine %s serves %d models; using %r", client.url, len(models), models[0])
    model_id = str(models[0].get("id"))
    max_len = models[0].get("max_model_len")
    info = await client.model_info()
    sglang = info is not None and "model_path" in info
    local = tokenizer.encode(PROBE)  # as a completion prompt: /tokenize's default
    exact = await _check_tokenizer(client, model_id, local)
    token_prompts = exact and await _accepts_token_prompts(client, model_id, local)
    prompt: list[int] | str = local if token_prompts else PROBE
    priority = await _accepts_priority(client, model_id, prompt)
    if not priority:
        log.warning(
            "engine %s refuses a request priority: start it with --scheduling-policy priority "
            "so it admits requests in the graph's order (sending none meanwhile)",
            client.url,
        )
    order = (Dialect.SGLANG, *PROBE_ORDER) if sglang else PROBE_ORDER
    dialect = await _find_dialect(client, model_id, prompt, order)
    max_len = int(max_len) if max_len else None
    return EngineInfo(model_id, max_len, priority, token_prompts, dialect, sglang)


async def _check_tokenizer(client: EngineClient, model_id: str, local: list[int]) -> bool:
    """Whether the engine's ids are exactly ours (False: it has no tokenize endpoint and
    passed the weak check). RemoteStartError when they differ."""
    remote = await client.tokenize(model_id, PROBE)
    if remote is None:
        await _check_token_count(client, model_id, len(local))
        return False
    if remote != local:
        at = next((i for i, (a, b) in enumerate(zip(local, remote, strict=False)) if a != b), None)
        where = f"first difference at token {at}" if at is not None else "lengths differ"
        raise RemoteStartError(
            f"engine {client.url} (model {model_id!r}) tokenizes differently from the local "
            f"--model directory: {len(remote)} vs {len(local)} tokens for a probe string, "
            f"{where}; point --model at the same model's directory"
        )
    return True


async def _check_token_count(client: EngineClient, model_id: str, num_local: int) -> None:
    """The weak check for engines without /tokenize: the probe's prompt token count."""
    log.warning(
        "engine %s has no /tokenize; checking the probe's token count only, and sending "
        "text prompts",
        client.url,
    )
    answer = await client.complete(
        {"model": model_id, "prompt": PROBE, "max_tokens": 1, "temperature": 0}
    )
    num_remote = answer.get("usage", {}).get("prompt_tokens")
    if num_remote != num_local:
        raise RemoteStartError(
            f"engine {client.url} (model {model_id!r}) counts {num_remote} tokens in a probe "
            f"string, the local --model directory {num_local}: not the same tokenizer"
        )


async def _accepts_token_prompts(client: EngineClient, model_id: str, ids: list[int]) -> bool:
    """Whether a token-id prompt is accepted (a 4xx: the engine takes text only)."""
    body = {"model": model_id, "prompt": ids, "max_tokens": 1, "temperature": 0}
    try:
        await client.complete(body)
    except EngineRejected as exc:
        log.warning(
            "engine %s refuses token-id prompts (%s): sending text prompts, tokenized by the "
            "engine (segment boundaries are not kept exactly)",
            client.url,
            exc,
        )
        return False
    return True


async def _find_dialect(
    client: EngineClient,
    model_id: str,
    prompt: list[int] | str,
    order: tuple[Dialect, ...] = PROBE_ORDER,
) -> Dialect:
    """The first dialect of ``order`` whose one-choice constraint the engine obeys. The
    budget allows a token per byte: an engine's grammar may spell the choice with any
    tokenization (vLLM's does, with a random model), not only the tokenizer's own."""
    max_tokens = len(PROBE_CHOICE.encode()) + 8
    body = {"model": model_id, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    for dialect in dict.fromkeys(order):
        try:
            answer = await client.complete({**body, **constraint_fields(dialect, probe_choice())})
        except EngineRejected:
            continue  # a field it refuses outright: not its dialect
        text = str((answer.get("choices") or [{}])[0].get("text") or "")
        # all of it, or (cut by the budget) a long prefix no free model writes by chance
        if text == PROBE_CHOICE or (len(text) >= 8 and PROBE_CHOICE.startswith(text)):
            return dialect
    log.warning(
        "engine %s enforces no structured outputs in any known dialect: constrained calls "
        "(JSON schemas, tools...) will not be sent to it",
        client.url,
    )
    return Dialect.NONE


async def _accepts_priority(client: EngineClient, model_id: str, prompt: list[int] | str) -> bool:
    """Whether a one-token request with a priority is accepted (vLLM answers 400 unless
    started with ``--scheduling-policy priority``)."""
    body = {"model": model_id, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    try:
        await client.complete({**body, "priority": 1})
    except EngineRejected as exc:
        if "priority" not in str(exc).lower():
            raise EngineDown(f"a one-token probe request failed: {exc}") from None
        return False
    return True
