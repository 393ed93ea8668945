"""JSON whitespace layouts on the built-in engine: how often a JSON-constrained reply ends
by itself ("stop") rather than at ``max_tokens`` ("length"), per layout
(``EngineConfig.json_whitespace``: bounded, any, compact), and what each costs to compile.
A benchmark, not a test: it prints markdown tables.

    python -m eclectus.benchmarks.json_whitespace [--model tiny] [--max-tokens 200]
        [--budget-guarantee]

Every request is a chat prompt with a ``json`` constraint, greedy and sampled (temperature
1, seeds 0-3): the schemas are the ones the tests use, and the issue's ``Person`` as
pydantic writes it and as langchain-openai sends it (strict: every field required).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from eclectus.protocol.sampling import SamplingParams
from eclectus.server.engine.engine_config import JSON_WHITESPACE, JsonWhitespace
from eclectus.server.engine.llm import LLM

_ADDRESS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "street": {"type": "string"}},
    "required": ["city", "street"],
}
_PERSON_PROPERTIES = {
    "name": {"type": "string"},
    "age": {"type": "integer"},
    "role": {"enum": ["engineer", "doctor", "teacher"], "type": "string"},
    "hobbies": {"items": {"type": "string"}, "maxItems": 3, "type": "array"},
    "address": {"anyOf": [_ADDRESS, {"type": "null"}]},
}
SCHEMAS: dict[str, dict[str, Any]] = {
    "Person": {
        "type": "object",
        "properties": _PERSON_PROPERTIES,
        "required": ["name", "age", "role", "hobbies"],
    },
    "Person (strict)": {
        "type": "object",
        "properties": _PERSON_PROPERTIES,
        "required": list(_PERSON_PROPERTIES),
        "additionalProperties": False,
    },
    "City": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 10},
            "rank": {"type": "integer", "minimum": 1, "maximum": 99},
        },
        "required": ["name", "rank"],
    },
    "Colour": {
        "type": "object",
        "properties": {"colour": {"type": "string"}, "bright": {"type": "boolean"}},
        "required": ["colour", "bright"],
    },
    "Answer": {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "score": {"type": "integer"}},
        "required": ["answer", "score"],
    },
    "Weather": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
    },
    "Team": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "members": {
                "type": "array",
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"},
                        "name": {"type": "string"},
                        "active": {"type": "boolean"},
                    },
                    "required": ["id", "name", "active"],
                },
            },
            "count": {"type": "integer"},
        },
        "required": ["city", "members", "count"],
    },
}
PROMPTS = (
    "Describe Maya, a 41-year-old engineer from Oslo, as JSON.",
    "Return a JSON object describing a person named Maya who is 41 and lives in Oslo.",
    "Describe the team in Lima with 2 members as a JSON object.",
    "Hello",
    "Who is Dan?",
    "The weather where?",
    "A city:",
    "Is it so?",
)
SAMPLINGS = ((0.0, None), (1.0, 0), (1.0, 1), (1.0, 2), (1.0, 3))  # (temperature, seed)


def stop_rates(model: str, layout: JsonWhitespace, max_tokens: int, guarantee: bool) -> str:
    """One table row: replies that ended with "stop", overall, greedy and per schema, the
    replies that parse (all of them with the budget guarantee, which closes what
    ``max_tokens`` cuts; without it, a "length" reply is cut JSON), mean output tokens and
    the whitespace share of the text."""
    llm = LLM(model, json_whitespace=layout, budget_guarantee=guarantee)
    prompts, params, names = [], [], []
    for name, schema in SCHEMAS.items():
        for prompt in PROMPTS:
            text = llm.tokenizer.apply_chat_template([user(prompt)])
            for temperature, seed in SAMPLINGS:
                prompts.append(text)
                names.append(name)
                params.append(
                    SamplingParams(
                        max_tokens=max_tokens,
                        temperature=temperature,
                        seed=seed,
                        structured_outputs={"json": schema},
                    )
                )
    outputs = llm.generate(prompts, params)
    stopped = [o.finish_reason == "stop" for o in outputs]
    parsed = sum(_parses(o.text) for o in outputs)
    assert parsed == len(outputs) or not guarantee, "the guarantee closes every reply"
    greedy = [s for s, p in zip(stopped, params, strict=True) if p.temperature == 0]
    per_schema = " | ".join(
        f"{sum(s for s, n in zip(stopped, names, strict=True) if n == name)}" for name in SCHEMAS
    )
    tokens = statistics.mean(len(o.token_ids) for o in outputs)
    spaces = sum(sum(c.isspace() for c in o.text) for o in outputs)
    share = spaces / max(1, sum(len(o.text) for o in outputs))
    return (
        f"| {layout} | {sum(stopped)}/{len(stopped)} | {sum(greedy)}/{len(greedy)} | "
        f"{parsed}/{len(outputs)} | {per_schema} | {tokens:.1f} | {share:.0%} |"
    )


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def compile_ms(model: str, rounds: int) -> list[str]:
    """Milliseconds to compile every schema once, per layout: a fresh grammar cache each
    time, the layouts alternating within each round; median and range over ``rounds``."""
    engines = {
        layout: LLM(model, json_whitespace=layout).engine.grammar_backend
        for layout in JSON_WHITESPACE
    }
    times: dict[str, list[float]] = {layout: [] for layout in JSON_WHITESPACE}
    for _ in range(rounds):
        for layout, backend in engines.items():
            backend._cache.clear()  # a cold compile is what is measured
            start = time.perf_counter()
            for schema in SCHEMAS.values():
                sampling = SamplingParams(structured_outputs={"json": schema})
                assert sampling.structured_outputs is not None
                backend.compile(sampling.structured_outputs)
            times[layout].append(1000 * (time.perf_counter() - start))
    return [
        f"| {layout} | {statistics.median(ms):.0f} | {min(ms):.0f}-{max(ms):.0f} |"
        for layout, ms in times.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5, help="compile-time rounds")
    parser.add_argument(
        "--budget-guarantee",
        action="store_true",
        help="with the engine's opt-in budget guarantee (EngineConfig.budget_guarantee)",
    )
    args = parser.parse_args()
    names = " | ".join(SCHEMAS)
    print(f"| layout | stop | stop, greedy | parses | {names} | mean tokens | whitespace |")
    print("|---" * (len(SCHEMAS) + 6) + "|")
    for layout in JSON_WHITESPACE:
        print(stop_rates(args.model, layout, args.max_tokens, args.budget_guarantee))
    print(f"\n(per schema: stops of {len(PROMPTS) * len(SAMPLINGS)} replies)")
    print("\n| layout | compile ms, all schemas (median) | range |\n|---|---|---|")
    print("\n".join(compile_ms(args.model, args.rounds)))


if __name__ == "__main__":
    main()
