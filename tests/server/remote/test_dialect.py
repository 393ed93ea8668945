"""The engine dialects (server/remote/dialect.py, members.py) against the request and response
shapes vLLM and SGLang define. SGLang has never run here (no CPU build): its shapes are
recorded from its source, sgl-project/sglang ``python/sglang/srt/entrypoints/openai/
protocol.py`` (``CompletionRequest``, ``CompletionStreamResponse``) at commit 004c82e0, and
kept as pydantic models with ``extra="forbid"`` so a field we send that SGLang does not define
fails here (SGLang itself would drop it silently)."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from eclectus.protocol import SamplingParams
from eclectus.protocol.structured import StructuredOutputs
from eclectus.protocol.tools import tool_call_constraint, tool_specs
from eclectus.server.backend import EngineRequest
from eclectus.server.front.prompt import Prompt
from eclectus.server.remote.dialect import (
    Dialect,
    Unenforceable,
    choice_regex,
    constraint_fields,
    supports,
)
from eclectus.server.remote.handshake import EngineInfo
from eclectus.server.remote.members import Attempt, RemoteMember, _piece


class SGLangStreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class SGLangCompletionRequest(BaseModel):
    """The fields of SGLang's CompletionRequest that a request of ours may carry (types as
    recorded; SGLang's own model has more, none of which we send)."""

    model_config = ConfigDict(extra="forbid")
    model: str
    prompt: list[int] | list[list[int]] | str | list[str]
    max_tokens: int = 16
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: SGLangStreamOptions | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    response_format: dict[str, Any] | None = None
    return_token_ids: bool = False
    rid: str | list[str] | None = None
    cache_salt: str | list[str] | None = None
    priority: int | None = None


# SGLang's ResponseFormat: type in text / json_object / json_schema; or a structural tag
SGLANG_FORMAT_TYPES = ("json_object", "json_schema", "structural_tag")

# A stream as SGLang's CompletionStreamResponse serializes it (token_ids only when asked)
SGLANG_STREAM = [
    {
        "id": "c1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "text": "Par",
                "logprobs": None,
                "finish_reason": None,
                "matched_stop": None,
                "token_ids": [3681],
            }
        ],
    },
    {
        "id": "c1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "text": "is",
                "logprobs": None,
                "finish_reason": "stop",
                "matched_stop": 2,
                "token_ids": [285],
            }
        ],
    },
    {
        "id": "c1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [],
        "usage": {
            "prompt_tokens": 7,
            "total_tokens": 9,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 5},
            "reasoning_tokens": 0,
        },
    },
]

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
KINDS: dict[str, StructuredOutputs] = {
    "json": StructuredOutputs(json_schema=SCHEMA),  # type: ignore[call-arg]
    "json_object": StructuredOutputs(json_object=True),
    "regex": StructuredOutputs(regex="[0-9]+"),
    "choice": StructuredOutputs(choice=("a.b", "c d")),
    "grammar": StructuredOutputs(grammar='root ::= "x"'),
    "structural_tag": tool_call_constraint(
        tool_specs(
            [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": SCHEMA},
                }
            ]
        ),
        "required",
    ),  # type: ignore[dict-item]
}


def member(dialect: Dialect, *, sglang: bool = False, token_prompts: bool = True) -> RemoteMember:
    """A RemoteMember as a handshake with such an engine leaves it (no network)."""
    from eclectus.models.presets import resolve_model_dir
    from eclectus.models.tokenizer import Tokenizer
    from eclectus.server.remote.client import EngineClient

    tokenizer = Tokenizer.from_dir(resolve_model_dir("tiny"))
    remote = RemoteMember(EngineClient("http://127.0.0.1:1/v1"), tokenizer)
    remote.info = EngineInfo("m", 4096, True, token_prompts, dialect, sglang)
    return remote


def attempt(
    sampling: SamplingParams, number: int = 0, generated: str = "", *, chat: bool = False
) -> Attempt:
    """An attempt at "Hello world" as a completion prompt (BOS first) or, with ``chat``, as
    a rendered chat turn (no BOS)."""
    tokenizer = member(Dialect.VLLM).tokenizer
    text = "<|user|>\nHello world\n" if chat else "Hello world"
    ids = tuple(tokenizer.encode(text, add_special_tokens=not chat))
    request = EngineRequest("r1", ids, sampling, priority=1.5, tenant="acme")
    return Attempt(request, Prompt.of_ids(ids), 16, number, generated)


@pytest.mark.parametrize("kind", list(KINDS))
def test_vllm_takes_every_kind_in_structured_outputs(kind: str) -> None:
    """vLLM >= 0.10: one key of ``structured_outputs`` per kind, the schema as an object,
    the structural tag as its JSON text (vLLM's StructuredOutputsParams field types)."""
    fields = constraint_fields(Dialect.VLLM, KINDS[kind])
    assert list(fields) == ["structured_outputs"]
    (key,) = fields["structured_outputs"]
    assert key == kind
    value = fields["structured_outputs"][kind]
    if kind == "json":
        assert value == SCHEMA
    if kind == "structural_tag":
        assert json.loads(value)["type"] == "structural_tag"


@pytest.mark.parametrize("kind", list(KINDS))
def test_sglang_request_validates_against_its_completion_request(kind: str) -> None:
    """A constrained SGLang request: every field is one SGLang's CompletionRequest defines,
    exactly one constraint (SGLang refuses two), priority negated (SGLang runs higher values
    first), an rid unique to the attempt."""
    sampling = SamplingParams(structured_outputs=KINDS[kind])
    body = member(Dialect.SGLANG, sglang=True).body(attempt(sampling), 4096)
    parsed = SGLangCompletionRequest.model_validate(body)
    constraints = [k for k in ("json_schema", "regex", "ebnf", "response_format") if k in body]
    assert len(constraints) == 1
    assert parsed.priority == -1500 and parsed.rid and parsed.rid.endswith("-r1-0")
    if parsed.response_format is not None:
        assert parsed.response_format["type"] in SGLANG_FORMAT_TYPES
    if kind == "json":
        assert json.loads(parsed.json_schema or "") == SCHEMA  # SGLang takes the text
    if kind == "choice":
        assert re.fullmatch(parsed.regex or "", "a.b") and re.fullmatch(parsed.regex or "", "c d")
        assert not re.fullmatch(parsed.regex or "", "aXb")


def test_vllm_body_has_no_sglang_fields_and_priority_lower_first() -> None:
    """vLLM gets no rid (it would log it as ignored) and the rank as is (lower first)."""
    body = member(Dialect.VLLM).body(attempt(SamplingParams()), 4096)
    assert (
        "rid" not in body
        and body["priority"] == 1500
        and body["prompt"] == list(attempt(SamplingParams()).prompt.token_ids)
    )


def test_a_constrained_call_never_ignores_eos() -> None:
    """The built-in engine ends a constrained reply where its grammar does, ignore_eos or
    not; vLLM would generate past it: the body asks for EOS there, and only there."""
    json_only = StructuredOutputs(json={"type": "object"})
    constrained = SamplingParams(ignore_eos=True, structured_outputs=json_only)
    assert member(Dialect.VLLM).body(attempt(constrained), 4096)["ignore_eos"] is False
    plain = SamplingParams(ignore_eos=True)
    assert member(Dialect.VLLM).body(attempt(plain), 4096)["ignore_eos"] is True


def test_stream_interval_goes_to_vllm_only_above_1() -> None:
    """A call nobody watches asks vLLM (and Eclectus) for chunks of its interval; a watched
    one (1) sends no field; SGLang, which has no such request field, never gets one."""
    coarse = attempt(SamplingParams())
    coarse = dataclasses.replace(
        coarse, request=dataclasses.replace(coarse.request, stream_interval=16)
    )
    assert member(Dialect.VLLM).body(coarse, 4096)["stream_interval"] == 16
    assert "stream_interval" not in member(Dialect.VLLM).body(attempt(SamplingParams()), 4096)
    sglang = member(Dialect.SGLANG, sglang=True).body(coarse, 4096)
    SGLangCompletionRequest.model_validate(sglang)  # no field SGLang does not define


def test_guided_dialect_maps_all_but_the_structural_tag() -> None:
    """vLLM < 0.10: guided_* fields; a tool call's structural tag cannot be expressed there,
    so it is Unenforceable (the call is refused, never sent unconstrained)."""
    assert constraint_fields(Dialect.VLLM_GUIDED, KINDS["choice"]) == {
        "guided_choice": ["a.b", "c d"]
    }
    assert constraint_fields(Dialect.VLLM_GUIDED, KINDS["json"]) == {"guided_json": SCHEMA}
    assert not supports(Dialect.VLLM_GUIDED, KINDS["structural_tag"])
    with pytest.raises(Unenforceable):
        constraint_fields(Dialect.VLLM_GUIDED, KINDS["structural_tag"])
    assert not supports(Dialect.NONE, KINDS["regex"]) and supports(Dialect.NONE, None)


def test_text_prompt_engines_get_the_prompts_text() -> None:
    """An engine without token-id prompts gets the prompt's ids decoded, BOS left to it to
    add, and after a failover the text generated so far appended; a chat prompt (no BOS)
    keeps its special tokens' text and asks the engine to add none."""
    remote = member(Dialect.VLLM, token_prompts=False)
    body = remote.body(attempt(SamplingParams()), 4096)
    assert body["prompt"] == "Hello world" and "add_special_tokens" not in body
    assert remote.body(attempt(SamplingParams(), 1, " again"), 4096)["prompt"] == (
        "Hello world again"
    )
    chat = remote.body(attempt(SamplingParams(), chat=True), 4096)
    assert chat["prompt"] == "<|user|>\nHello world\n" and chat["add_special_tokens"] is False
    as_ids = member(Dialect.VLLM).body(attempt(SamplingParams(), chat=True), 4096)
    assert "add_special_tokens" not in as_ids  # ids go as they are


def test_sglang_stream_chunks_become_pieces() -> None:
    """SGLang's stream chunks (recorded shape): text and ids per piece, the finish reason,
    and the usage-only chunk with no choices."""
    pieces = [_piece(chunk) for chunk in SGLANG_STREAM]
    assert [p.text for p in pieces] == ["Par", "is", ""]
    assert [p.token_ids for p in pieces] == [(3681,), (285,), ()]
    assert pieces[1].finish_reason == "stop"
    assert pieces[2].num_prompt_tokens == 7 and pieces[2].num_cached_tokens == 5
    bare = {"choices": [{"index": 0, "text": "x", "finish_reason": None}]}  # no return_token_ids
    assert _piece(bare).token_ids is None


def test_choice_regex_escapes_only_metacharacters() -> None:
    pattern = choice_regex(("1+1", "a-b c", "(x)"))
    assert pattern == r"(1\+1|a-b c|\(x\))"
    assert all(re.fullmatch(pattern, c) for c in ("1+1", "a-b c", "(x)"))
