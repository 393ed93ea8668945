"""The OpenAI-compatible endpoints on the server's one port, driven by the real `openai`
client, over the real engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest
from websockets.asyncio.client import connect
from ws_helpers import RawClient

from eclectus.protocol.sampling import SamplingParams
from eclectus.server.backend import EngineRequest
from eclectus.server.config import ServerConfig, read_token_file
from eclectus.server.front.app import EclectusServer, start_server
from eclectus.server.front.openai_schema import (
    NULL_IS_DEFAULT,
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIRequest,
    parse,
    to_sampling,
)

CHAT = {"role": "user", "content": "Hi"}

pytestmark = pytest.mark.slow


@pytest.fixture
async def server(real_engine: object, tmp_path: Path) -> AsyncIterator[EclectusServer]:
    tokens = tmp_path / "tokens"
    tokens.write_text("alice sk-test\nbob sk-bob\n")
    config = ServerConfig(port=0, tenant_tokens=read_token_file(str(tokens)))
    server = await start_server(config, real_engine, owns_backend=False)  # type: ignore[arg-type]
    yield server
    await server.close()


@pytest.fixture
def base_url(server: EclectusServer) -> str:
    return server.openai_url


async def direct(engine: object, prompt: str, max_tokens: int) -> str:
    ids = tuple(engine.engine.tokenizer.encode(prompt))  # type: ignore[attr-defined]
    request = EngineRequest("direct", ids, SamplingParams(max_tokens=max_tokens))
    return "".join([out.text async for out in engine.generate(request)])  # type: ignore[attr-defined]


async def test_completion_matches_the_engine(real_engine: object, base_url: str) -> None:
    """A greedy /v1/completions answer is the engine's own greedy answer, with usage."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test")
    result = await client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=12, temperature=0
    )
    assert result.choices[0].text == await direct(real_engine, "Once upon a time", 12)
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


async def test_batch_prompts_answer_in_order(real_engine: object, base_url: str) -> None:
    """A list prompt (langchain_openai's OpenAI sends these) gives one choice per prompt."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test")
    result = await client.completions.create(
        model="tiny", prompt=["alpha", "beta gamma"], max_tokens=6, temperature=0
    )
    assert [c.index for c in result.choices] == [0, 1]
    assert result.choices[1].text == await direct(real_engine, "beta gamma", 6)


async def test_refusals_name_the_field(base_url: str) -> None:
    """Unsupported or malformed parameters get a 400 naming the field, an unknown model a
    404, bad auth a 401; all in OpenAI's error shape."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="n: only n=1"):
        await client.completions.create(model="tiny", prompt="x", n=2)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        await client.completions.create(model="tiny", prompt="x", max_tokens=0)
    with pytest.raises(openai.NotFoundError, match="does not exist") as missing:
        await client.completions.create(model="gpt-nothing", prompt="x")
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert set(missing.value.body) == {"message", "type", "param", "code"}  # type: ignore[arg-type]
    wrong = openai.AsyncOpenAI(base_url=base_url, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await wrong.completions.create(model="tiny", prompt="x")
    # and the server still answers afterwards
    assert (await client.models.list()).data[0].id == "tiny"


@pytest.mark.parametrize("field", NULL_IS_DEFAULT)
@pytest.mark.parametrize("schema", [CompletionRequest, ChatCompletionRequest])
def test_a_null_sampling_field_is_its_default(field: str, schema: type[OpenAIRequest]) -> None:
    """vLLM's schemas let these be null (the openai client sends ``"temperature": null``
    for ``temperature=None``); null reads as the field left out."""
    body = {"prompt": "x"} if schema is CompletionRequest else {"messages": [CHAT]}
    with_null = parse(schema, json.dumps({**body, field: None}).encode())
    assert with_null == parse(schema, json.dumps(body).encode())
    assert to_sampling(with_null, 16) == to_sampling(parse(schema, json.dumps(body).encode()), 16)


def test_nulls_and_neutral_values_where_vllm_takes_them() -> None:
    """Chat's ``n`` may be null (completions' may not, as in vLLM); a penalty this server
    does not implement is accepted null or neutral, else refused by name."""
    assert parse(ChatCompletionRequest, b'{"messages": [{"role": "user"}], "n": null}').n is None
    with pytest.raises(ApiError, match=r"^n: "):
        parse(CompletionRequest, b'{"prompt": "x", "n": null}')
    neutral = {"frequency_penalty": 0.0, "presence_penalty": None, "repetition_penalty": 1.0}
    parse(CompletionRequest, json.dumps({"prompt": "x", **neutral, "min_p": None}).encode())
    with pytest.raises(ApiError, match="repetition_penalty: only 1 is supported"):
        parse(CompletionRequest, b'{"prompt": "x", "repetition_penalty": 1.2}')
    with pytest.raises(ApiError, match="min_p: only 0 is supported"):
        parse(ChatCompletionRequest, b'{"messages": [{"role": "user"}], "min_p": 0.1}')


async def test_the_openai_clients_none_is_the_default(base_url: str) -> None:
    """``temperature=None`` etc. through the real client, on both endpoints: the reply is
    the one the defaults give (sampled at 1.0, so the same seed picks the same tokens)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0)
    nulls = dict(temperature=None, top_p=None, stream=None, seed=7, max_tokens=8)
    chat = await client.chat.completions.create(model="tiny", messages=[CHAT], n=None, **nulls)  # type: ignore[call-overload]
    default = await client.chat.completions.create(
        model="tiny", messages=[CHAT], seed=7, max_tokens=8
    )
    assert chat.choices[0].message.content == default.choices[0].message.content
    text = await client.completions.create(model="tiny", prompt="Once", **nulls)  # type: ignore[call-overload]
    plain = await client.completions.create(model="tiny", prompt="Once", seed=7, max_tokens=8)
    assert text.choices[0].text == plain.choices[0].text


async def test_over_window_prompt_is_a_400(server: EclectusServer, base_url: str) -> None:
    """A prompt longer than the model's window is the client's mistake: 400 naming the
    prompt and the limit, not a 500."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0)
    window = server.model.context_window
    limit = window - 1  # a prompt leaves room for one output token
    with pytest.raises(openai.BadRequestError, match=rf"prompt 0 has \d+ tokens, limit {limit}"):
        await client.completions.create(model="tiny", prompt="word " * (2 * window))


async def test_bearer_scheme_is_case_insensitive(base_url: str) -> None:
    """``Authorization: bearer T`` is the same credential as ``Bearer T`` (RFC 7235)."""
    async with httpx.AsyncClient() as http:
        for scheme in ("bearer", "BEARER", "Bearer"):
            answer = await http.get(
                f"{base_url}/models", headers={"authorization": f"{scheme} sk-test"}
            )
            assert answer.status_code == 200, scheme


async def test_malformed_http_does_not_hurt_the_server(base_url: str) -> None:
    """A non-JSON body is a 400; a garbage request line closes that connection only."""
    host, port = base_url.split("//")[1].split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = b"{not json"
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test\r\n"
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


async def test_cached_tokens_never_reflect_another_tenants_prompts(
    server: EclectusServer, base_url: str
) -> None:
    """Prefix-cache hits are shared within a tenant only: bob (over /v1 and over the
    WebSocket) sees no cached tokens for the prompt alice just sent; alice does."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 8
    alice = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test")
    bob = openai.AsyncOpenAI(base_url=base_url, api_key="sk-bob")

    async def cached(client: openai.AsyncOpenAI) -> int:
        result = await client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
        assert result.usage is not None and result.usage.prompt_tokens_details is not None
        return result.usage.prompt_tokens_details.cached_tokens or 0

    assert await cached(alice) == 0
    assert await cached(bob) == 0
    async with connect(server.url) as ws:
        client = RawClient(ws)
        await client.hello(token="sk-bob")
        await client.ask(
            {
                "type": "submit",
                "id": "s",
                "vars": [{"id": "p", "value": prompt[:-1]}],
                "calls": [
                    {
                        "id": "c",
                        "template": "{{p}} {{out}}",
                        "bind": {"p": "p", "out": "out"},
                        "sampling": {"out": {"max_tokens": 2}},
                    }
                ],
                "gets": [{"var": "out"}],
            }
        )
        value = (await client.values(1))["out"]
    assert value["usage"]["cached_tokens"] > 0  # bob's own /v1 prompt, shared within bob
    assert await cached(alice) > 0


async def test_token_id_prompts_and_tokenize(
    real_engine: object, server: EclectusServer, base_url: str
) -> None:
    """vLLM's forms (what a remote Eclectus engine is sent): /tokenize gives the ids a text
    prompt becomes; those ids as the prompt (alone or in a list) answer exactly as the text
    does, and generate the built-in engine's own greedy ids, as scheduled graph calls;
    return_token_ids lists the generated ids, streamed or not; ids the model has no
    embedding for are a 400."""
    root = base_url.removesuffix("/v1")
    headers = {"Authorization": "Bearer sk-test"}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        tokenized = (await http.post(f"{root}/tokenize", json={"prompt": "Once upon"})).json()
        ids = real_engine.engine.tokenizer.encode("Once upon")  # type: ignore[attr-defined]
        assert tokenized["tokens"] == ids and tokenized["count"] == len(ids)
        bare = {"prompt": "Once upon", "add_special_tokens": False}
        assert (await http.post(f"{root}/tokenize", json=bare)).json()["tokens"] == ids[1:]
        body = {"max_tokens": 8, "temperature": 0, "return_token_ids": True}
        by_text = await http.post(f"{base_url}/completions", json={**body, "prompt": "Once upon"})
        calls_before = server.metrics.calls_finished
        by_ids = await http.post(f"{base_url}/completions", json={**body, "prompt": [ids, ids]})
        assert server.metrics.calls_finished == calls_before + 2  # two graph calls
        texts = [c["text"] for c in by_ids.json()["choices"]]
        assert texts == [by_text.json()["choices"][0]["text"]] * 2
        assert by_text.json()["choices"][0]["token_ids"] == by_ids.json()["choices"][0]["token_ids"]
        generated = by_ids.json()["choices"][0]["token_ids"]
        assert len(generated) == 8
        request = EngineRequest(
            "direct-ids", tuple(ids), SamplingParams(max_tokens=8, temperature=0)
        )
        own = [i async for out in real_engine.generate(request) for i in out.token_ids]  # type: ignore[attr-defined]
        assert generated == own
        bad = await http.post(f"{base_url}/completions", json={**body, "prompt": [10**6]})
        assert bad.status_code == 400 and "token id" in bad.json()["error"]["message"]
        stream = {**body, "prompt": ids, "stream": True}
        async with http.stream("POST", f"{base_url}/completions", json=stream) as response:
            chunks = [
                json.loads(line[6:])
                async for line in response.aiter_lines()
                if line.startswith("data: {")
            ]
        streamed = [i for c in chunks if c["choices"] for i in c["choices"][0]["token_ids"]]
        assert streamed == generated
