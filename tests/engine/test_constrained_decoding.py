"""Grammar-constrained decoding on the real tiny engine: every output is valid by
construction, greedy or sampled, at tight and loose budgets (with the opt-in budget
guarantee), batched or alone; by default, outputs are what the model writes under the mask,
as stock vLLM's are."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
import torch
import xgrammar as xgr
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tool_fixtures import ADD_TOOL, weather_tool
from transformers import AutoTokenizer

from eclectus.models.presets import resolve_model_dir
from eclectus.protocol import SamplingParams
from eclectus.server.backend import EngineOutput
from eclectus.server.engine import EngineConfig, LLMEngine, structured


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    """An engine with the budget guarantee on (off by default): most tests here are of it."""
    return LLMEngine(EngineConfig(model="tiny", num_kv_blocks=512, budget_guarantee=True))


@pytest.fixture(scope="module")
def stock_engine() -> LLMEngine:
    """The default engine: no jump-forward, no budget guarantee."""
    return LLMEngine(EngineConfig(model="tiny", num_kv_blocks=512))


def run(engine: LLMEngine, requests: dict[str, tuple[str, SamplingParams]]) -> dict[str, Any]:
    """Runs the requests together; request id -> (text, finish reason, output tokens)."""
    for request_id, (prompt, sampling) in requests.items():
        engine.add_tokens(request_id, engine.tokenizer.encode(prompt), sampling)
    texts: dict[str, str] = {}
    final: dict[str, EngineOutput] = {}
    while engine.has_unfinished:
        for out in engine.step():
            texts[out.request_id] = texts.get(out.request_id, "") + out.text
            if out.finished:
                final[out.request_id] = out
    return {k: (texts[k], final[k].finish_reason, final[k].num_output_tokens) for k in requests}


def closing_length(engine: LLMEngine, sampling: SamplingParams) -> int:
    """Tokens of the shortest output the closing policy finds for the constraint."""
    assert sampling.structured_outputs is not None
    state = engine.grammar_backend.new_state(sampling.structured_outputs, None)
    length = state.closing_length(state.matcher)
    assert length is not None
    return length


# -- random JSON schemas --------------------------------------------------------------------

_names = st.sampled_from(["id", "name", "tags", "ok", "n", "kind", "x"])
_leaves = st.one_of(
    st.just({"type": "integer"}),
    st.just({"type": "number"}),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 8)),
    st.lists(st.sampled_from(["a", "bb", "c d", "é"]), min_size=1, max_size=3, unique=True).map(
        lambda values: {"enum": values}
    ),
)


def _object(props: dict[str, Any], required: list[bool]) -> dict[str, Any]:
    names = list(props)
    return {
        "type": "object",
        "properties": props,
        "required": [n for n, r in zip(names, required, strict=False) if r],
        "additionalProperties": False,
    }


schemas = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.builds(
            lambda items, n: {"type": "array", "items": items, "maxItems": n},
            inner,
            st.integers(0, 3),
        ),
        st.builds(
            _object,
            st.dictionaries(_names, inner, min_size=1, max_size=3),
            st.lists(st.booleans(), min_size=3, max_size=3),
        ),
    ),
    max_leaves=6,
)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schema=schemas, slack=st.sampled_from([0, 3, 40]))
def test_random_schemas_give_valid_json_greedy_and_sampled(
    engine: LLMEngine, schema: dict[str, Any], slack: int
) -> None:
    """Greedy and sampled outputs parse and validate, also at a budget that barely holds the
    shortest instance (the budget guarantee closes the structure in time)."""
    probe = SamplingParams(structured_outputs={"json": schema})
    budget = closing_length(engine, probe) + slack
    requests = {
        "greedy": ("Reply in JSON:", SamplingParams(max_tokens=budget, **_json(schema))),
        "sampled": (
            "Reply in JSON:",
            SamplingParams(max_tokens=budget, temperature=1.0, seed=7, **_json(schema)),
        ),
        "free": ("Say anything", SamplingParams(max_tokens=8)),
    }
    outs = run(engine, requests)
    for name in ("greedy", "sampled"):
        text, _, num_tokens = outs[name]
        jsonschema.validate(json.loads(text), schema)
        assert num_tokens <= budget
    assert outs["free"][2] == 8  # the free request in the same batch is untouched


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"structured_outputs": {"json": schema}}


def test_a_budget_below_the_shortest_instance_is_refused(engine: LLMEngine) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    needed = closing_length(engine, SamplingParams(**_json(schema)))
    with pytest.raises(ValueError, match=f"max_tokens={needed - 1} cannot hold"):
        engine.add_tokens("r", [1, 2], SamplingParams(max_tokens=needed - 1, **_json(schema)))
    assert not engine.has_unfinished


@pytest.mark.parametrize("temperature", [0.0, 1.3])
def test_regex_choice_grammar_and_json_object_outputs_match(
    engine: LLMEngine, temperature: float
) -> None:
    regex, choices = r"[a-z]{2,4}-\d{2}", ["yes", "no", "maybe so"]
    grammar = 'root ::= "(" item ("," item)* ")"\nitem ::= [0-9] | "x"'

    def sp(**so: Any) -> SamplingParams:
        return SamplingParams(max_tokens=48, temperature=temperature, seed=3, structured_outputs=so)

    outs = run(
        engine,
        {
            "regex": ("id:", sp(regex=regex)),
            "choice": ("answer:", sp(choice=choices)),
            "grammar": ("tuple:", sp(grammar=grammar)),
            "object": ("obj:", sp(json_object=True)),
        },
    )
    assert re.fullmatch(regex, outs["regex"][0])
    assert outs["choice"][0] in choices and outs["choice"][1] == "stop"
    assert re.fullmatch(r"\((?:[0-9x])(?:,[0-9x])*\)", outs["grammar"][0])
    assert isinstance(json.loads(outs["object"][0]), dict)


def test_a_bad_grammar_is_a_clear_error(engine: LLMEngine) -> None:
    with pytest.raises(ValueError, match=r"structured_outputs\.grammar"):
        engine.add_tokens("g", [1], SamplingParams(structured_outputs={"grammar": "root ::= ("}))


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "bb"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
}


def _mixed_requests() -> dict[str, tuple[str, SamplingParams]]:
    return {
        "g": ("Person:", SamplingParams(max_tokens=48, **_json(SCHEMA))),
        "s": ("Person:", SamplingParams(max_tokens=48, temperature=0.9, seed=5, **_json(SCHEMA))),
        "c": ("Pick:", SamplingParams(max_tokens=8, structured_outputs={"choice": ["x", "yy"]})),
        "f": ("Free text", SamplingParams(max_tokens=12)),
        "fs": ("Free text", SamplingParams(max_tokens=12, temperature=0.7, seed=9)),
    }


def test_a_constrained_batch_equals_its_requests_one_by_one(engine: LLMEngine) -> None:
    """Differential: the mask of one row never leaks into another."""
    together = run(engine, _mixed_requests())
    alone = {k: run(engine, {k: v})[k] for k, v in _mixed_requests().items()}
    assert together == alone
    jsonschema.validate(json.loads(together["g"][0]), SCHEMA)


def test_preemption_keeps_the_matcher_consistent() -> None:
    """A pool too small for the batch preempts and recomputes; the outputs are those of a
    roomy pool (the matcher is never fed a token twice)."""
    small = LLMEngine(EngineConfig(model="tiny", num_kv_blocks=10, block_size=16))
    roomy = LLMEngine(EngineConfig(model="tiny", num_kv_blocks=512, block_size=16))
    prompt = "Describe a person in JSON. " * 4
    requests = {
        f"r{i}": (prompt + str(i), SamplingParams(max_tokens=40, **_json(SCHEMA))) for i in range(4)
    }
    got = run(small, requests)
    assert small.scheduler.num_preemptions > 0
    assert got == run(roomy, requests)
    for text, _, _ in got.values():
        jsonschema.validate(json.loads(text), SCHEMA)


def test_jump_forward_saves_steps_and_keeps_outputs_valid() -> None:
    """Opt-in jump-forward spends fewer steps on the same schema; its output is valid, but
    the forced text comes as the grammar tokenizes it, so it is not the default's."""
    sampling = SamplingParams(max_tokens=64, **_json(SCHEMA))
    steps = {}
    for jump in (True, False):
        eng = LLMEngine(EngineConfig(model="tiny", num_kv_blocks=64, jump_forward=jump))
        out = run(eng, {"r": ("Person:", sampling)})["r"]
        jsonschema.validate(json.loads(out[0]), SCHEMA)
        steps[jump] = eng.counters.num_steps
    assert steps[True] < steps[False]
    assert not EngineConfig().jump_forward and not EngineConfig().budget_guarantee


def test_a_grammar_that_is_complete_ends_with_its_eos_without_a_step_for_it(
    stock_engine: LLMEngine,
) -> None:
    """Once only the EOS is allowed, it is appended as any sampler would pick it: the ids end
    with it (as vLLM's do, so usage counts it), and no step is spent computing it."""
    engine = stock_engine
    steps = engine.counters.num_steps
    sampling = SamplingParams(structured_outputs={"choice": ["done"]})
    engine.add_tokens("c", engine.tokenizer.encode("Pick:"), sampling)
    outputs = [out for _ in range(16) if engine.has_unfinished for out in engine.step()]
    token_ids = [t for out in outputs for t in out.token_ids]
    assert "".join(out.text for out in outputs) == "done"
    assert outputs[-1].finish_reason == "stop"
    assert token_ids[-1] in engine.tokenizer.eos_token_ids
    assert engine.tokenizer.decode(token_ids[:-1]) == "done"
    assert engine.counters.num_steps - steps == len(token_ids) - 1


@given(
    vocab_size=st.integers(1, 160),
    drawn=st.sets(st.integers(0, 159), max_size=3),
    padding=st.booleans(),
)
@example(vocab_size=64, drawn={31}, padding=False)  # bit 31: the int32's sign
@example(vocab_size=40, drawn={39}, padding=True)  # beside the bits past the vocabulary
def test_the_sole_allowed_token_is_read_from_the_packed_mask(
    vocab_size: int, drawn: set[int], padding: bool
) -> None:
    """``forced_stop`` reads a packed row's one allowed id without listing the vocabulary:
    it agrees with the full listing for any set of ids (bit 31 and the bits past the
    vocabulary included)."""
    allowed = {token for token in drawn if token < vocab_size}
    num_words = (vocab_size + 31) // 32
    words = [0] * num_words
    for token in allowed:
        words[token // 32] |= 1 << (token % 32)
    if padding:  # bits past the vocabulary, as an all-ones allocation leaves them
        words[-1] |= ~((1 << (vocab_size - 32 * (num_words - 1))) - 1) & 0xFFFFFFFF
    row = torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)
    assert structured._allowed(row, vocab_size) == sorted(allowed)
    expected = next(iter(allowed)) if len(allowed) == 1 else None
    assert structured._sole_allowed(row, vocab_size) == expected


def test_the_stop_token_that_ends_a_grammar_adds_no_text(stock_engine: LLMEngine) -> None:
    """Even under ``ignore_eos`` and with ``skip_special_tokens`` off (a /v1 chat with tools),
    the EOS that terminates the grammar is in the ids, not in the text, as on vLLM."""
    sampling = SamplingParams(
        structured_outputs={"choice": ["done"]}, ignore_eos=True, skip_special_tokens=False
    )
    stock_engine.add_tokens("s", stock_engine.tokenizer.encode("Pick:"), sampling)
    outputs = [o for _ in range(16) if stock_engine.has_unfinished for o in stock_engine.step()]
    assert "".join(o.text for o in outputs) == "done"
    assert outputs[-1].finish_reason == "stop"
    assert outputs[-1].token_ids[-1] in stock_engine.tokenizer.eos_token_ids


def test_by_default_a_reply_that_reaches_max_tokens_is_cut_there(
    stock_engine: LLMEngine,
) -> None:
    """No budget guarantee by default: a greedy JSON reply that has not closed at max_tokens
    ends there unclosed ("length"), as on stock vLLM; the opt-in guarantee closes it."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    sampling = SamplingParams(max_tokens=8, **_json(schema))
    text, reason, num_tokens = run(stock_engine, {"r": ("Reply in JSON:", sampling)})["r"]
    assert (reason, num_tokens) == ("length", 8) and '"city"' in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    guaranteed = LLMEngine(EngineConfig(model="tiny", num_kv_blocks=64, budget_guarantee=True))
    closed, _, num_closed = run(guaranteed, {"r": ("Reply in JSON:", sampling)})["r"]
    assert json.loads(closed)["city"] is not None and num_closed <= 8


def test_the_grammar_sees_the_vocabulary_as_vllms_xgrammar_backend_does(
    stock_engine: LLMEngine,
) -> None:
    """vLLM builds its xgrammar view with ``TokenizerInfo.from_huggingface``: special tokens
    keep their text (a JSON string may hold ``<|user|>``), and a greedy constrained reply is
    only vLLM's if the masks are. The engine's own build must equal it field by field."""
    model_dir = resolve_model_dir("tiny")
    ours = stock_engine.grammar_backend.info
    ref = xgr.TokenizerInfo.from_huggingface(
        AutoTokenizer.from_pretrained(str(model_dir)), vocab_size=ours.vocab_size
    )
    for field in ("decoded_vocab", "vocab_type", "add_prefix_space", "stop_token_ids"):
        assert getattr(ours, field) == getattr(ref, field), field
    assert ours.special_token_ids == ref.special_token_ids


TOOLS = [weather_tool(description=None, max_city_length=12), ADD_TOOL]


@pytest.mark.parametrize(
    ("choice", "parallel", "names"),
    [
        ("required", True, {"get_weather", "add"}),
        ("required", False, {"get_weather", "add"}),
        ({"type": "function", "function": {"name": "add"}}, True, {"add"}),
    ],
)
def test_required_and_named_tool_choice_give_only_valid_calls(
    engine: LLMEngine, choice: object, parallel: bool, names: set[str]
) -> None:
    from eclectus.protocol.tool_formats import tool_format
    from eclectus.protocol.tools import tool_call_constraint, tool_specs

    specs = tool_specs(TOOLS)
    constraint = tool_call_constraint(specs, choice, parallel)  # type: ignore[arg-type]
    schemas = {s.name: s.parameters for s in specs}
    requests = {
        f"r{seed}": (
            "Call a tool:",
            SamplingParams(
                max_tokens=120, temperature=1.0, seed=seed, structured_outputs=constraint
            ),
        )
        for seed in range(3)
    }
    for text, _, _ in run(engine, requests).values():
        content, calls = tool_format("hermes").parse(text)
        assert content == "" and calls, text
        assert len(calls) == 1 or parallel
        for call in calls:
            assert call.name in names
            jsonschema.validate(call.arguments, schemas[call.name])


def test_a_complete_output_that_could_grow_past_the_budget_ends_instead(
    engine: LLMEngine,
) -> None:
    """``a|abcdef`` at max_tokens 3: after "a" the grammar could go on, but "abcdef" would
    not fit; whatever is sampled, the output is a full match within the budget."""
    for seed in range(6):
        sampling = SamplingParams(
            max_tokens=3, temperature=2.0, seed=seed, structured_outputs={"regex": "a|abcdef"}
        )
        text, _, num_tokens = run(engine, {f"r{seed}": ("x", sampling)})[f"r{seed}"]
        assert text in ("a", "abcdef") and num_tokens <= 3


def test_a_line_format_closes_within_the_budget(engine: LLMEngine) -> None:
    """A ReAct-style line (``[^\\n]`` up to 300 characters, then a fixed line) at a budget far
    below the longest thought: the closing policy that writes a newline first ends the
    thought in time, so every sampled output is a full match within the budget."""
    pattern = "Thought: [^\\n]{1,300}\\nAnswer: (yes|no)"
    for seed in range(4):
        sampling = SamplingParams(
            max_tokens=24, temperature=1.5, seed=seed, structured_outputs={"regex": pattern}
        )
        text, _, num_tokens = run(engine, {f"r{seed}": ("Think:", sampling)})[f"r{seed}"]
        assert re.fullmatch(pattern, text), text
        assert num_tokens <= 24


def _free_whitespace(text: str) -> bool:
    """Whether a JSON text has whitespace between its tokens (pure)."""
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char.isspace():
            return True
    return False


def test_compact_json_is_a_server_wide_default(engine: LLMEngine) -> None:
    """``EngineConfig.json_whitespace="compact"`` (``eclectus serve --compact-json``): every
    JSON constraint's grammar refuses any whitespace between tokens (vLLM's grammar for
    ``disable_any_whitespace``), as a request's ``disable_any_whitespace`` does; the bounded
    layout allows a line break (tests/engine/test_json_layout.py)."""
    config = EngineConfig(
        model="tiny", num_kv_blocks=256, json_whitespace="compact", budget_guarantee=True
    )
    compact = LLMEngine(config)  # the guarantee only so that every reply parses
    constraint = SamplingParams(
        max_tokens=48, structured_outputs={"json": {"type": "object"}}
    ).structured_outputs
    assert constraint is not None
    for backend, allows in ((engine.grammar_backend, True), (compact.grammar_backend, False)):
        state = backend.new_state(constraint, None)
        assert state.matcher.accept_string("{") and state.matcher.accept_string("\n") is allows
    sampling = SamplingParams(max_tokens=48, structured_outputs={"json_object": True})
    prompts = {f"r{i}": (f"Reply in JSON, item {i}: ", sampling) for i in range(4)}
    for text, _, _ in run(compact, prompts).values():
        assert isinstance(json.loads(text), dict) and not _free_whitespace(text)
