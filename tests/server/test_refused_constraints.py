"""Constraints the engine cannot compile are the client's mistake, refused before dispatch
(``bad_request`` on the socket, 400 on /v1), and grammars are compiled off the engine's step
thread, so a slow schema never stalls other requests' steps. Real engine, real sockets."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import openai
import pytest
from websockets.asyncio.client import connect
from ws_helpers import RawClient

from eclectus.protocol import SamplingParams
from eclectus.server.backend import EngineRequest, RequestRefused
from eclectus.server.front.app import EclectusServer

pytestmark = pytest.mark.slow

# each one passes the protocol's own checks (valid JSON Schema object, a regex Python
# compiles, non-empty EBNF) and is refused by xgrammar
REFUSED = [
    ({"regex": r"(a)\1"}, "Backreference"),
    ({"regex": r"(?=a)b"}, "Lookahead"),
    ({"grammar": "root ::= ("}, "EBNF parser error"),
    ({"json": {"type": "object", "properties": {"a": {"type": "strin"}}}}, "strin"),
    ({"json": {"properties": {"a": {"$ref": "#/$defs/missing"}}}}, "missing"),
]


def say(engine: object) -> tuple[int, ...]:
    """The ids of the prompt "Say:" (BOS first), as the server's front computes them."""
    return tuple(engine.engine.tokenizer.encode("Say:"))  # type: ignore[attr-defined]


@pytest.mark.parametrize(("constraint", "why"), REFUSED)
async def test_the_engine_refuses_an_uncompilable_constraint_as_bad_request(
    real_engine: Any, constraint: dict[str, Any], why: str
) -> None:
    """generate raises RequestRefused (code bad_request) naming the kind and xgrammar's
    reason, before the request is queued."""
    sampling = SamplingParams(max_tokens=8, structured_outputs=constraint)
    request = EngineRequest("refused", say(real_engine), sampling)
    with pytest.raises(RequestRefused, match=why) as caught:
        async for _ in real_engine.generate(request):
            pass
    assert caught.value.code == "bad_request"
    assert f"structured_outputs.{next(iter(constraint))}" in str(caught.value)
    assert "/project/cpp" not in str(caught.value)  # no C++ source location
    assert not real_engine.engine.has_unfinished


@pytest.mark.parametrize(("constraint", "why"), REFUSED[:3])
async def test_v1_answers_an_uncompilable_constraint_with_400(
    real_server: EclectusServer, constraint: dict[str, Any], why: str
) -> None:
    client = openai.AsyncOpenAI(base_url=real_server.openai_url, api_key="none")
    with pytest.raises(openai.BadRequestError, match=why):
        await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=8,
            extra_body={"structured_outputs": constraint},
        )


async def test_the_socket_refuses_the_submit_naming_the_output(real_server: EclectusServer) -> None:
    """bad_request on the submit itself, naming the call and output; nothing runs."""
    async with connect(real_server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        good = {"max_tokens": 4}
        bad = {"max_tokens": 4, "structured_outputs": {"grammar": "root ::= ("}}
        frame = {
            "type": "submit",
            "id": "s1",
            "calls": [
                {"id": "c0", "segments": [{"text": "A:"}, {"gen": "a", "sampling": good}]},
                {"id": "c1", "segments": [{"text": "B:"}, {"gen": "b", "sampling": bad}]},
            ],
            "gets": [{"var": "a"}],
        }
        error = await client.ask(frame)
        assert error["type"] == "error" and error["code"] == "bad_request", error
        assert error["field"] == "calls[1].sampling.structured_outputs"
        assert "'b'" in error["message"] and "EBNF" in error["message"]
        # the session lives on and the refused fragment added nothing
        ok = await client.ask({"type": "submit", "id": "s2", "calls": [frame["calls"][0]]})
        assert ok["type"] == "ack", ok


async def test_the_step_thread_never_compiles_a_grammar(
    real_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every compilation of constrained requests runs elsewhere than the step thread, and
    while a slow compilation runs, a free request's steps go on."""
    from eclectus.server.engine.structured import GrammarBackend

    compiled_on: list[str] = []
    release = threading.Event()
    original = GrammarBackend._compile

    def recording(self: GrammarBackend, constraint: Any) -> Any:
        compiled_on.append(threading.current_thread().name)
        if constraint.kind == "regex" and "slow" in (constraint.regex or ""):
            release.wait(10)  # a schema that takes long to compile
        return original(self, constraint)

    monkeypatch.setattr(GrammarBackend, "_compile", recording)

    async def run(request_id: str, sampling: SamplingParams) -> str:
        request = EngineRequest(request_id, say(real_engine), sampling)
        return "".join([out.text async for out in real_engine.generate(request)])

    slow = asyncio.ensure_future(
        run("slow", SamplingParams(max_tokens=8, structured_outputs={"regex": "slow[a-z]{3}"}))
    )
    await asyncio.sleep(0.2)  # the slow compilation has started
    free = await asyncio.wait_for(run("free", SamplingParams(max_tokens=16)), 30)
    assert not slow.done()  # the free request finished while the grammar compiled
    release.set()
    assert (await slow).startswith("slow")
    others = [
        run(f"c{i}", SamplingParams(max_tokens=12, structured_outputs={"json": schema}))
        for i, schema in enumerate(
            [{"type": "object", "properties": {"k": {"enum": [str(i), "x"]}}} for i in range(4)]
        )
    ]
    await asyncio.gather(*others)
    assert free and len(compiled_on) == 5
    assert "eclectus-engine" not in compiled_on


async def test_a_maps_call_with_an_uncompilable_constraint_is_refused_at_submit(
    real_server: EclectusServer,
) -> None:
    """The check covers the call a map instantiates, before any element exists."""
    async with connect(real_server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        bad = {"max_tokens": 4, "structured_outputs": {"regex": r"(a)\1"}}
        frame = {
            "type": "submit",
            "id": "m1",
            "vars": [{"id": "items", "value": '["x", "y"]'}],
            "maps": [
                {
                    "id": "m",
                    "items": "items",
                    "element": "e",
                    "output": "outs",
                    "call": {
                        "id": "per",
                        "segments": [
                            {"text": "Item: "},
                            {"var": "e"},
                            {"gen": "o", "sampling": bad},
                        ],
                    },
                }
            ],
        }
        error = await client.ask(frame)
        assert error["type"] == "error" and error["code"] == "bad_request", error
        assert error["field"] == "maps[0].sampling.structured_outputs"
        assert "Backreference" in error["message"]


async def test_a_later_map_steps_uncompilable_constraint_is_refused_at_submit(
    real_server: EclectusServer,
) -> None:
    """The check covers every step of a map's pipeline, naming the step in ``then``."""
    async with connect(real_server.url) as ws:
        client = RawClient(ws)
        await client.hello()
        bad = {"max_tokens": 4, "structured_outputs": {"regex": r"(a)\1"}}
        first = [{"text": "Item: "}, {"var": "e"}, {"gen": "o", "sampling": {"max_tokens": 2}}]
        frame = {
            "type": "submit",
            "id": "m2",
            "vars": [{"id": "items", "value": '["x"]'}],
            "maps": [
                {
                    "id": "m",
                    "items": "items",
                    "element": "e",
                    "output": "outs",
                    "call": {"id": "per", "segments": first},
                    "then": [
                        {"id": "next", "segments": [{"var": "o"}, {"gen": "p"}]},
                        {"id": "last", "segments": [{"var": "p"}, {"gen": "q", "sampling": bad}]},
                    ],
                }
            ],
        }
        error = await client.ask(frame)
        assert error["type"] == "error" and error["code"] == "bad_request", error
        assert error["field"] == "maps[0].then[1].sampling.structured_outputs"
        assert "'q'" in error["message"]
