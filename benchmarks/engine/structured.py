"""Structured-outputs benchmark: the cost of a constrained step beside a free one,
jump-forward on vs off, and the valid-JSON rate at tight budgets with the budget guarantee
on vs off. A benchmark, not a test: it prints markdown tables.

    python -m eclectus.benchmarks.engine.structured [--model tiny] [--threads N]

Every figure is measured in this run on the built-in engine; prompts are fixed text.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import jsonschema

from eclectus.protocol.sampling import SamplingParams
from eclectus.server.engine.engine_config import EngineConfig
from eclectus.server.engine.llm_engine import LLMEngine

# A record with many fixed keys and short values: most of its text is forced.
RECORD = {
    "type": "object",
    "properties": {
        name: {"type": "boolean"} if i % 2 else {"enum": ["low", "medium", "high"]}
        for i, name in enumerate(
            [
                "priority",
                "is_urgent",
                "category_level",
                "has_attachment",
                "risk_assessment",
                "requires_followup",
                "confidence_band",
                "was_escalated",
            ]
        )
    },
}
RECORD["required"] = list(RECORD["properties"])
# Mostly free text: one long string field.
NOTE = {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}
TIGHT_SCHEMAS: list[dict[str, Any]] = [
    NOTE,
    RECORD,
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["id", "tags"],
        },
    },
    {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "properties": {
                    "b": {
                        "type": "object",
                        "properties": {"c": {"type": "string"}},
                        "required": ["c"],
                    }
                },
                "required": ["b"],
            },
            "n": {"type": "number"},
        },
        "required": ["a", "n"],
    },
]


def run(
    engine: LLMEngine, requests: list[SamplingParams], prompt: str = "Reply:"
) -> tuple[list[str], float, int, int]:
    """Runs the requests together: (texts, seconds, steps, output tokens)."""
    ids = engine.tokenizer.encode(prompt)
    for i, sampling in enumerate(requests):
        engine.add_tokens(f"b{i}", ids, sampling)
    texts = [""] * len(requests)
    steps0, tokens = engine.counters.num_steps, 0
    start = time.perf_counter()
    while engine.has_unfinished:
        for out in engine.step():
            texts[int(out.request_id[1:])] += out.text
            if out.finished:
                tokens += out.num_output_tokens
    return texts, time.perf_counter() - start, engine.counters.num_steps - steps0, tokens


def step_cost(model: str, threads: int, batch: int, tokens: int) -> list[str]:
    """ms per step: a batch of free requests vs the same batch held to NOTE (one long
    string, so every token is sampled through the mask), with the budget guarantee's check
    off (the mask alone) and on."""
    rows = []
    cases = (
        ("free", None, True),
        ("json (string field), guarantee off", {"json": NOTE}, False),
        ("json (string field), guarantee on", {"json": NOTE}, True),
    )
    for label, so, guarantee in cases:
        config = EngineConfig(model=model, num_threads=threads, budget_guarantee=guarantee)
        engine = LLMEngine(config)
        sampling = [
            SamplingParams(
                max_tokens=tokens,
                temperature=1.0,
                seed=i,
                ignore_eos=True,
                structured_outputs=so,
            )
            for i in range(batch)
        ]
        run(engine, sampling[:1])  # warm the grammar cache and the kernels
        _, seconds, steps, num_tokens = run(engine, sampling)
        rows.append(
            f"| {label} | {batch} | {steps} | {1000 * seconds / steps:.2f} | "
            f"{num_tokens / seconds:.0f} |"
        )
    return rows


def jump_forward(model: str, threads: int, batch: int) -> list[str]:
    """Output tokens/s on RECORD (compact: no free whitespace, so most of the text is
    forced) with jump-forward off and on, for one request and for a batch."""
    rows = []
    so = {"json": RECORD, "disable_any_whitespace": True}
    for size in (1, batch):
        for jump in (False, True):
            config = EngineConfig(model=model, num_threads=threads, jump_forward=jump)
            engine = LLMEngine(config)
            sampling = [
                SamplingParams(max_tokens=256, temperature=1.0, seed=i, structured_outputs=so)
                for i in range(size)
            ]
            run(engine, sampling[:1])
            texts, seconds, steps, tokens = run(engine, sampling)
            for text in texts:
                jsonschema.validate(json.loads(text), RECORD)
            rows.append(
                f"| {'on' if jump else 'off'} | {size} | {steps} | {tokens} | "
                f"{seconds:.2f} | {tokens / seconds:.0f} |"
            )
    return rows


def valid_rate(model: str, threads: int, samples: int) -> list[str]:
    """Share of outputs that parse and validate at budgets of the shortest instance + slack,
    with the budget guarantee on and off (sampled at temperature 1.0)."""
    rows = []
    for slack in (0, 4, 16):
        cells = []
        for guarantee in (True, False):
            engine = LLMEngine(
                EngineConfig(model=model, num_threads=threads, budget_guarantee=guarantee)
            )
            ok = total = 0
            for schema in TIGHT_SCHEMAS:
                probe = SamplingParams(structured_outputs={"json": schema})
                assert probe.structured_outputs is not None
                state = engine.grammar_backend.new_state(probe.structured_outputs, None)
                budget = (state.closing_length(state.matcher) or 1) + slack
                sampling = [
                    SamplingParams(
                        max_tokens=budget,
                        temperature=1.0,
                        seed=s,
                        structured_outputs={"json": schema},
                    )
                    for s in range(samples)
                ]
                texts, *_ = run(engine, sampling)
                for text in texts:
                    total += 1
                    ok += valid_json(text, schema)
            cells.append(f"{ok}/{total} ({100 * ok / total:.0f}%)")
        rows.append(f"| shortest + {slack} | {cells[0]} | {cells[1]} |")
    return rows


def valid_json(text: str, schema: dict[str, Any]) -> bool:
    """Whether ``text`` parses as JSON and validates against ``schema`` (pure)."""
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--only-jump", action="store_true", help="only the jump-forward table")
    args = parser.parse_args()
    print("| batch of | requests | steps | ms/step | output tok/s |\n|---|---|---|---|---|")
    if not args.only_jump:
        print("\n".join(step_cost(args.model, args.threads, args.batch, 64)))
    print("\n| jump-forward | requests | steps | output tokens | s | output tok/s |")
    print("|---|---|---|---|---|---|")
    print("\n".join(jump_forward(args.model, args.threads, args.batch)))
    print("\n| budget | valid, guarantee on | valid, guarantee off |\n|---|---|---|")
    if not args.only_jump:
        print("\n".join(valid_rate(args.model, args.threads, args.samples)))


if __name__ == "__main__":
    main()
