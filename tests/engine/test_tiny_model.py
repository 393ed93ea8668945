"""The trained ``tiny`` preset: a reproducible corpus, tokenizer and training script, and
greedy outputs that read as English, parse as JSON and call tools."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from tool_fixtures import weather_tool

from eclectus.models.presets import SHIPPED_TOKENIZER, SHIPPED_WEIGHTS
from eclectus.models.tiny_chat import BOS, EOS, PAD_ID
from eclectus.models.tiny_tokenizer import train_tokenizer
from eclectus.protocol.chat_template import render_chat
from eclectus.server.engine import LLM, EngineConfig, SamplingParams
from eclectus.training.tiny_corpus import build_corpus
from eclectus.training.train_tiny import TrainSpec, learning_rate, pack_rows, train

MiB = 1 << 20
TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return build_corpus()


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(config=EngineConfig(model="tiny", kv_cache_bytes=16 * MiB))


def test_corpus_is_deterministic_and_well_formed(corpus: list[str]) -> None:
    """Same list every time; every document starts with BOS and holds an EOS; every JSON
    document and tool call in it parses."""
    assert build_corpus() == corpus
    assert all(d.startswith(BOS) and EOS in d for d in corpus)
    json_docs = [d for d in corpus if d.startswith(BOS + "Data about ")]
    assert json_docs
    for doc in json_docs:
        json.loads(doc.split(":\n", 1)[1].removesuffix(EOS))
    calls = [c for d in corpus for c in TOOL_CALL.findall(d) if not c.startswith('{"name": <')]
    assert len(calls) > 1000
    assert all(set(json.loads(c)) == {"name", "arguments"} for c in calls)


def test_shipped_tokenizer_is_what_training_gives(corpus: list[str]) -> None:
    """tiny/tokenizer.json is reproducible: train_tokenizer on the corpus writes it again."""
    assert json.loads(train_tokenizer(corpus).to_str()) == json.loads(SHIPPED_TOKENIZER.read_text())


def test_pack_rows_keeps_documents_whole() -> None:
    rows = pack_rows([[5, 6, 7], [8, 9], [10, 11, 12, 13]], seq_len=5)
    assert rows.tolist() == [[5, 6, 7, 8, 9], [10, 11, 12, 13, PAD_ID]]
    with pytest.raises(ValueError, match="more than 5"):
        pack_rows([[1] * 6], seq_len=5)


def test_learning_rate_warms_up_then_decays() -> None:
    spec = TrainSpec(steps=100, warmup_steps=10, lr=1.0, min_lr_ratio=0.1)
    rates = [learning_rate(s, spec) for s in range(100)]
    assert rates[0] == pytest.approx(0.1) and rates[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(rates[9:]))
    assert rates[-1] == pytest.approx(0.1, abs=1e-3)


def test_training_is_reproducible(tmp_path: Path) -> None:
    """Two short runs of the script write byte-identical weights, and the tokenizer it writes
    is the shipped one (the full run only takes more steps)."""
    spec = TrainSpec(steps=2, batch_rows=2)
    first = train(tmp_path / "a", spec, log_every=10**9)
    train(tmp_path / "b", spec, log_every=10**9)
    weights = [(tmp_path / d / "model.safetensors").read_bytes() for d in "ab"]
    assert weights[0] == weights[1] and weights[0] != SHIPPED_WEIGHTS.read_bytes()
    assert (tmp_path / "a" / "tokenizer.json").read_text() == SHIPPED_TOKENIZER.read_text()
    assert first["corpus_docs"] > 10000 and 0 < first["final_loss"] < 10


def greedy(llm: LLM, prompt: str, max_tokens: int = 64) -> tuple[str, str]:
    """The greedy reply to ``prompt`` and why it ended."""
    (out,) = llm.generate([prompt], SamplingParams(max_tokens=max_tokens))
    return out.text, out.finish_reason


def chat(llm: LLM, messages: list[dict], tools: list[dict] | None = None) -> str:
    tok = llm.tokenizer
    return render_chat(
        tok.effective_chat_template, messages, template_vars=tok.template_vars, tools=tools
    )


def test_greedy_english_is_a_sentence_and_stops(llm: LLM) -> None:
    """A chat question gets one short English sentence, then EOS."""
    text, reason = greedy(llm, chat(llm, [{"role": "user", "content": "What does a heron eat?"}]))
    assert reason == "stop"
    assert re.fullmatch(r"[A-Z][a-z]*( [a-z]+)+\.", text), text


def test_greedy_json_parses(llm: LLM) -> None:
    """A JSON request gets one JSON object with the keys and value types asked for: every
    string and brace closed, then EOS."""
    ask = "Return a JSON object describing a person named Maya who is 41 and lives in Oslo."
    text, reason = greedy(llm, chat(llm, [{"role": "user", "content": ask}]))
    assert reason == "stop"
    value = json.loads(text)
    assert set(value) == {"name", "age", "city"}
    assert isinstance(value["name"], str) and isinstance(value["age"], int)


WEATHER = weather_tool("Get the current weather in a city.")


def test_greedy_tool_call_parses(llm: LLM) -> None:
    """After tool definitions a request gets one <tool_call> block holding a JSON object with
    a name and an arguments object, then EOS."""
    ask = [{"role": "user", "content": "What is the weather in Lisbon?"}]
    text, reason = greedy(llm, chat(llm, ask, [WEATHER]))
    assert reason == "stop"
    (call,) = TOOL_CALL.findall(text)
    assert text == f"<tool_call>\n{call}\n</tool_call>"
    value = json.loads(call)
    assert set(value) == {"name", "arguments"} and set(value["arguments"]) == {"city"}


def test_greedy_answer_after_a_tool_result(llm: LLM) -> None:
    """After a tool's result the reply is a sentence again, not another call."""
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    messages = [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": '{"city": "Oslo", "temperature": 3, "condition": "snowy"}'},
    ]
    text, reason = greedy(llm, chat(llm, messages, [WEATHER]))
    assert reason == "stop" and "<tool_call>" not in text
    assert re.fullmatch(r"[A-Z][^\n]*\.", text), text
