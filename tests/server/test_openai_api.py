"""The OpenAI-compatible endpoints, driven by the real `openai` client, over the real engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import openai
import pytest
from scripted_engine import ScriptedEngine

from eclectus.protocol.sampling import SamplingParams
from eclectus.server.backend import EngineRequest
from eclectus.server.http_server import start_http_server
from eclectus.server.openai_api import ApiError, OpenAIApi

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine() -> Iterator[object]:
    from eclectus.server.engine import AsyncEngine

    engine = AsyncEngine.from_config(model="tiny", num_kv_blocks=256)
    yield engine
    asyncio.run(engine.shutdown())


@pytest.fixture
async def base_url(engine: object) -> AsyncIterator[str]:
    render = engine.engine.tokenizer.apply_chat_template  # type: ignore[attr-defined]
    api = OpenAIApi(engine, render, token="sk-test")  # type: ignore[arg-type]
    server = await start_http_server(api.handle, "127.0.0.1", 0, max_body_bytes=1 << 20)
    yield f"http://127.0.0.1:{server.port}/v1"
    await server.close()


async def direct(engine: object, prompt: str, max_tokens: int) -> str:
    request = EngineRequest("direct", (prompt,), SamplingParams(max_tokens=max_tokens))
    return "".join([out.text async for out in engine.generate(request)])  # type: ignore[attr-defined]


async def test_completion_matches_the_engine(engine: object, base_url: str) -> None:
    """A greedy /v1/completions answer is the engine's own greedy answer, with usage."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test")
    result = await client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=12, temperature=0
    )
    assert result.choices[0].text == await direct(engine, "Once upon a time", 12)
    assert result.usage is not None and result.usage.completion_tokens == 12
    assert result.choices[0].finish_reason == "length"


async def test_streaming_chat_concatenates_to_the_full_answer(base_url: str) -> None:
    """Streamed chat deltas concatenate to the non-streamed message; usage comes last."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    full = await client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0
    )
    stream = await client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    async for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        usage = chunk.usage or usage
    assert "".join(pieces) == full.choices[0].message.content
    assert usage is not None and usage.completion_tokens == 10


async def test_batch_prompts_answer_in_order(engine: object, base_url: str) -> None:
    """A list prompt (langchain_openai's OpenAI sends these) gives one choice per prompt."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test")
    result = await client.completions.create(
        model="tiny", prompt=["alpha", "beta gamma"], max_tokens=6, temperature=0
    )
    assert [c.index for c in result.choices] == [0, 1]
    assert result.choices[1].text == await direct(engine, "beta gamma", 6)


async def test_refusals_name_the_field(base_url: str) -> None:
    """Unsupported or malformed parameters get a 400 naming the field; bad auth a 401."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="n: only n=1"):
        await client.completions.create(model="tiny", prompt="x", n=2)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        await client.completions.create(model="tiny", prompt="x", max_tokens=0)
    wrong = openai.AsyncOpenAI(base_url=base_url, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await wrong.completions.create(model="tiny", prompt="x")
    # and the server still answers afterwards
    assert (await client.models.list()).data[0].id == "tiny"


async def test_malformed_http_does_not_hurt_the_server(base_url: str) -> None:
    """A non-JSON body is a 400; a garbage request line closes that connection only."""
    host, port = base_url.split("//")[1].split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = b"{not json"
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer sk-test\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    answer = await reader.read()
    assert answer.startswith(b"HTTP/1.1 400")
    assert "error" in json.loads(answer.split(b"\r\n\r\n", 1)[1])
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"garbage\r\n\r\n")
    assert (await reader.read()).startswith(b"HTTP/1.1 400")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n")
    assert (await reader.read()).startswith(b"HTTP/1.1 400")
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test")
    assert (await client.models.list()).data[0].id == "tiny"


async def test_batch_prompts_reach_the_engine_together() -> None:
    """A list prompt's requests are all submitted before any finishes (the engine batches
    them), and one failing cancels the others."""
    engine = ScriptedEngine(hold=True)
    api = OpenAIApi(engine, lambda messages: "")  # type: ignore[arg-type]
    body = json.dumps({"prompt": ["alpha", "beta", "gamma"], "max_tokens": 4}).encode()
    pending = asyncio.ensure_future(api.completions(body))
    for _ in range(10):
        await asyncio.sleep(0)
    assert len(engine.requests) == 3 and not pending.done()
    engine.release()
    result = await pending
    assert [c["text"] for c in result["choices"]] == [  # type: ignore[index]
        "".join([o.text async for o in ScriptedEngine().generate(r)]) for r in engine.requests
    ]

    failing = ScriptedEngine(hold=True, fail_if=lambda r: r.request_id.endswith("-0"))
    api = OpenAIApi(failing, lambda messages: "")  # type: ignore[arg-type]
    pending = asyncio.ensure_future(api.completions(body))
    for _ in range(10):
        await asyncio.sleep(0)
    failing.release()
    with pytest.raises(ApiError, match="engine error"):
        await pending
    assert failing.running == set()
