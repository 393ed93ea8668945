"""What reaches the engine for a prompt of several segments: the model tokenizer's ids of
the flat text (transformers' own, BOS as the config says), and at each seam the count of
ids lying wholly before it, whatever the seams (hypothesis, scheduler and front, a scripted
engine); and with the real engine, that prefix reuse and pins survive flat tokenization."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import stock_reference as stock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_helpers import drain, make_scheduler, submit
from scripted_engine import FRONT, ScriptedEngine
from websockets.asyncio.client import connect
from ws_helpers import RawClient

from eclectus.models.tiny_chat import SPECIAL_TOKENS, TOOL_CALL_TOKENS
from eclectus.server.config import ServerConfig
from eclectus.server.front.app import EclectusServer, start_server

LITERALS = (*SPECIAL_TOKENS, *TOOL_CALL_TOKENS)
# constants ending in a space, colon, newline or letter; values starting with a space, a
# letter, a digit or a multi-byte character; halves of a word
SEAMS = ["Q: ", "A1:", "Notes\n", "un", " what", "believable", "42", "é", "🙂x", " ", "\t", "ab"]
PIECE = st.one_of(st.sampled_from(SEAMS), st.text(max_size=12))


def flat_ids(text: str, add_special_tokens: bool) -> list[int]:
    return stock.hf_tokenizer()(text, add_special_tokens=add_special_tokens).input_ids


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    pieces=st.lists(PIECE, min_size=1, max_size=5),
    as_vars=st.lists(st.booleans(), min_size=5, max_size=5),
    chat=st.booleans(),
)
def test_the_engine_gets_the_flat_texts_ids(
    pieces: list[str], as_vars: list[bool], chat: bool
) -> None:
    """Constants and variable values, in any order and cut anywhere: the ids are
    transformers' for the joined text (a chat prompt's with no special token added), and
    each seam's count is the front's (ids wholly before the seam, monotonic, the last one
    the prompt's length)."""
    text = "".join(pieces)
    if any(lit in text for lit in LITERALS) or not text:
        return  # a special token's spelling may form at a seam; an empty prompt is refused
    asyncio.run(_check(pieces, as_vars, chat))


async def _check(pieces: list[str], as_vars: list[bool], chat: bool) -> None:
    engine = ScriptedEngine()
    sched = make_scheduler(engine)
    app = sched.open_app("a")
    segments: list[dict[str, Any]] = []
    variables = []
    for i, piece in enumerate(pieces):
        if as_vars[i]:
            variables.append({"id": f"v{i}", "value": piece})
            segments.append({"var": f"v{i}"})
        else:
            segments.append({"text": piece})
    segments.append({"gen": "out", "sampling": {"max_tokens": 2}})
    call = {"id": "c", "segments": segments, "add_special_tokens": not chat}
    submit(sched, app, vars=variables, calls=[call], gets=[{"var": "out"}])
    await drain(sched)
    (request,) = engine.requests
    assert list(request.prompt_token_ids) == flat_ids("".join(pieces), not chat)
    expected = FRONT.encode(pieces, not chat).prefix_ends
    assert request.prefix_ends == expected
    assert list(expected) == sorted(expected) and expected[-1] == len(request.prompt_token_ids)
    sched.prompt_tokenizer.close()


# -- the real engine: prefix reuse on flat ids -----------------------------------------------

SYSTEM = "You are the harbor's assistant. You answer questions about the ferries briefly. "


@pytest.fixture
async def engine_server(real_engine: object) -> Any:
    server = await start_server(
        ServerConfig(port=0, max_inflight=1), real_engine, owns_backend=False
    )
    yield server
    await server.close()


def shared_prefix_calls(constant: str, questions: list[str]) -> dict[str, Any]:
    """One submit: a call per question, all starting with ``constant`` then the question,
    activated together (one get of their join) so they wait for each other in the queue."""
    sampling = {"max_tokens": 2}
    calls = [
        {
            "id": f"c{i}",
            "segments": [
                {"text": constant},
                {"var": f"q{i}"},
                {"gen": f"a{i}", "sampling": sampling},
            ],
        }
        for i in range(len(questions))
    ]
    outputs = [f"a{i}" for i in range(len(questions))]
    return {
        "type": "submit",
        "id": "s",
        "vars": [{"id": f"q{i}", "value": q} for i, q in enumerate(questions)],
        "calls": calls,
        "ops": [{"id": "j", "op": "join", "inputs": outputs, "output": "all"}],
        "gets": [{"var": "all", "criteria": "throughput"}],
    }


@pytest.mark.slow
async def test_a_shared_thousand_token_prefix_is_computed_once(
    engine_server: EclectusServer,
) -> None:
    """Five calls share a ~1,000-token constant: every call after the first is served its
    full blocks from the prefix cache (the tokens before the seam), so the five compute it
    once."""
    constant = SYSTEM * 40  # ends in a space: the questions' first tokens straddle the seam
    num_constant = len(FRONT.encode([constant]))
    assert 950 <= num_constant <= 1100
    questions = [f" what time is ferry {i}?" for i in range(5)]
    before = engine_server.backend.stats()
    async with connect(engine_server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        await client.send(shared_prefix_calls(constant, questions))
        await client.values(1)
    block = 16
    shared = FRONT.encode([constant, questions[0]]).prefix_ends[0] // block * block
    after = engine_server.backend.stats()
    prompts = sum(len(FRONT.encode([constant, q])) for q in questions)
    assert after.prompt_tokens - before.prompt_tokens == prompts
    hits = after.cache_hit_tokens - before.cache_hit_tokens
    assert hits >= 4 * shared >= 4 * 900
    assert after.prefill_tokens - before.prefill_tokens <= prompts - 4 * shared


@pytest.mark.slow
async def test_a_pin_survives_when_the_value_starts_with_a_space(
    engine_server: EclectusServer, real_engine: Any
) -> None:
    """The value's leading space belongs to its first word's token, so the constant's ids
    all lie before the seam: the first dispatched call pins all of them for its waiting
    sharers (one in flight at a time), and the pin is released once the last is dispatched."""
    constant = (SYSTEM * 4).rstrip()  # ends in "."; the values start with " "
    seen: list[Any] = []
    original = real_engine.generate

    def recording(request: Any) -> Any:
        seen.append(request)
        return original(request)

    real_engine.generate = recording
    try:
        async with connect(engine_server.url) as ws:
            client = RawClient(ws)
            await client.hello()
            await client.send(shared_prefix_calls(constant, [" what", " when", " where"]))
            await client.values(1)
    finally:
        del real_engine.generate
    first, *rest = seen
    assert first.pin_prefix_tokens == len(FRONT.encode([constant])) > 64
    assert first.prefix_ends[0] == first.pin_prefix_tokens  # the seam's count: all of them
    assert [r.pin_prefix_tokens for r in rest] == [0, 0]
    for _ in range(100):  # the unpin is sent in the background once the last sharer went
        if real_engine.stats().extra["num_pinned"] == 0:
            break
        await asyncio.sleep(0.05)
    assert real_engine.stats().extra["num_pinned"] == 0
