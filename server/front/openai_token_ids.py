"""vLLM's token-level extensions of the OpenAI API: what an Eclectus must serve to be another
Eclectus's engine (``eclectus serve --engine-url``, docs/engines.md).

- ``POST /v1/completions`` with ``prompt`` as token ids (a list of ints, or a list of such
  lists): each prompt becomes one call of the request's graph, exactly as a text prompt does
  (openai_api.py), so the scheduler's in-flight cap, app-FIFO fairness, priorities and tenant
  accounting apply to it. The call has no text segment: its ids travel beside the graph
  (``AppState.token_prompts``) and reach the engine as they are, never decoded and
  re-tokenized. The same limits as text prompts (``max_prompts_per_request``, and each
  prompt's length against ``max_prompt_tokens``, at most the context window less one) are
  checked here before anything is scheduled, as 400s naming the prompt.
- ``return_token_ids`` (always on for token-id prompts; on text prompts and chats when
  asked): each choice and each stream chunk lists its generated ids, so a remote backend can
  continue a request exactly after a failover; a chat also lists its rendered prompt's
  (``prompt_token_ids``), as vLLM does.
- ``POST /tokenize`` ``{"prompt", "add_special_tokens"}`` -> ``{"tokens", "count",
  "max_model_len"}``, the ids a text prompt becomes here; a long prompt is encoded on the
  prompt tokenizer's worker, so the loop keeps serving meanwhile.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from eclectus.server.front.openai_schema import ApiError
from eclectus.server.front.prompt_tokenizer import PromptTokenizer


class TokenizeRequest(BaseModel):
    """vLLM's ``POST /tokenize`` body (the completion form; ``messages`` is not taken)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True


async def tokenize(
    window: int, prompt_tokenizer: PromptTokenizer, request: TokenizeRequest
) -> dict[str, Any]:
    """The /tokenize answer (``window``: the served context window); a long prompt is
    encoded off the event loop, behind the prompts already queued (prompt_tokenizer.py)."""
    prompt = await prompt_tokenizer.tokenize_prompt((request.prompt,), request.add_special_tokens)
    tokens = list(prompt.token_ids)
    return {"tokens": tokens, "count": len(tokens), "max_model_len": window}


def token_prompts(prompt: object) -> list[list[int]] | None:
    """The prompt's token-id lists, None for a text prompt (pure)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return [list(prompt)]  # type: ignore[arg-type]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        return [list(p) for p in prompt]
    return None


def check_token_ids(prompts: list[list[int]], vocab_size: int | None, max_tokens: int) -> None:
    """Refuse empty prompts, prompts over ``max_tokens`` (the server's prompt limit) and ids
    the model has no embedding for, before they reach a batch shared with other requests
    (pure; ApiError(400) naming the prompt)."""
    for i, ids in enumerate(prompts):
        if not ids:
            raise ApiError(400, f"prompt: prompt {i} must not be empty", "prompt")
        if len(ids) > max_tokens:
            raise ApiError(400, f"prompt {i} has {len(ids)} tokens, limit {max_tokens}", "prompt")
        if vocab_size is not None and max(ids) >= vocab_size:
            raise ApiError(400, f"prompt: token id {max(ids)} >= {vocab_size}", "prompt")
