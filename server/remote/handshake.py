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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from eclectus.server.engine.tokenizer import Tokenizer
from eclectus.server.remote.client import EngineClient
from eclectus.server.remote.errors import EngineDown, EngineRejected, RemoteStartError

log = logging.getLogger(__name__)

PROBE = "Eclectus probe: héllo wörld, 你好 🙂 <s> 12345  \n\tdef f(x): return x**2\n"


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the handshake learnt. ``model_id``: the name requests carry; ``max_model_len``:
    the engine's context window (None: it does not say); ``priority``: it accepts a request
    ``priority`` (vLLM with ``--scheduling-policy priority``)."""

    model_id: str
    max_model_len: int | None
    priority: bool


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
    local = tokenizer.encode(PROBE, add_bos=True)
    await _check_tokenizer(client, model_id, local)
    priority = await _accepts_priority(client, model_id, local)
    if not priority:
        log.warning(
            "engine %s refuses a request priority: start it with --scheduling-policy priority "
            "so it admits requests in the graph's order (sending none meanwhile)",
            client.url,
        )
    return EngineInfo(model_id, int(max_len) if max_len else None, priority)


async def _check_tokenizer(client: EngineClient, model_id: str, local: list[int]) -> None:
    remote = await client.tokenize(model_id, PROBE)
    if remote is None:
        await _check_token_count(client, model_id, len(local))
        return
    if remote != local:
        at = next((i for i, (a, b) in enumerate(zip(local, remote, strict=False)) if a != b), None)
        where = f"first difference at token {at}" if at is not None else "lengths differ"
        raise RemoteStartError(
            f"engine {client.url} (model {model_id!r}) tokenizes differently from the local "
            f"--model directory: {len(remote)} vs {len(local)} tokens for a probe string, "
            f"{where}; point --model at the same model's directory"
        )


async def _check_token_count(client: EngineClient, model_id: str, num_local: int) -> None:
    """The weak check for engines without /tokenize: the probe's prompt token count."""
    log.warning("engine %s has no /tokenize; checking the probe's token count only", client.url)
    answer = await client.complete(
        {"model": model_id, "prompt": PROBE, "max_tokens": 1, "temperature": 0}
    )
    num_remote = answer.get("usage", {}).get("prompt_tokens")
    if num_remote != num_local:
        raise RemoteStartError(
            f"engine {client.url} (model {model_id!r}) counts {num_remote} tokens in a probe "
            f"string, the local --model directory {num_local}: not the same tokenizer"
        )


async def _accepts_priority(client: EngineClient, model_id: str, prompt: list[int]) -> bool:
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
