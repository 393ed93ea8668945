"""``eclectus run NAME``: run one recipe and print a short report.

    eclectus run map-reduce                          # embedded server, built-in tiny model
    eclectus run chain-summary --input notes.md      # your document
    eclectus run multi-agent --server ws://host:8765 --files 4 --rounds 3
    eclectus run map-reduce --backend openai --base-url http://host:8000/v1 --model NAME
    eclectus run shared-prompt --param users=16 --param rate=2.5
    eclectus run plan-execute --steps 8              # a LangGraph app, compiled

Sizes: the common flags below, or ``--param FIELD=VALUE`` for any field of the recipe's
params dataclass (docs/recipes.md lists them).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any
from urllib.parse import urlparse

from eclectus.recipes.embedded import embedded_server
from eclectus.recipes.params import set_from_text
from eclectus.recipes.result import format_report
from eclectus.recipes.runner import RECIPES, run_recipe
from eclectus.recipes.target import Target
from eclectus.recipes.text import load_input, load_sample, sample_names

# --output-tokens sets this field of each recipe's params.
OUTPUT_FIELD = {
    "map-reduce": "map_tokens",
    "chain-summary": "summary_tokens",
    "multi-agent": "code_tokens",
    "shared-prompt": "answer_tokens",
    "plan-execute": "step_tokens",
    "multi-agent-graph": "code_tokens",
}
COMMON_FLAGS = (
    "chunk_tokens",
    "num_chunks",
    "files",
    "rounds",
    "rate",
    "users",
    "requests",
    "steps",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``run`` flags (mutates ``parser``)."""
    parser.add_argument("name", choices=list(RECIPES), help="the recipe")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--input", help="a plain-text or markdown document")
    source.add_argument("--sample", choices=sample_names(), help="a bundled sample document")
    parser.add_argument("--server", help="an Eclectus server URL (ws://...); default: embedded")
    parser.add_argument(
        "--backend",
        choices=["eclectus", "openai"],
        default="eclectus",
        help="eclectus (default) or the stock OpenAI-compatible way",
    )
    parser.add_argument(
        "--base-url",
        help="openai backend: the server's /v1 URL "
        "(default: the embedded server's own /v1 endpoint)",
    )
    parser.add_argument(
        "--metrics-url",
        help="an Eclectus server's /metrics URL for a "
        "--base-url run (default: none, calls counted on the client)",
    )
    parser.add_argument(
        "--model",
        default="tiny",
        help="embedded: 'tiny' or a HF checkpoint "
        "directory (--model PATH); remote: the model name to request",
    )
    parser.add_argument("--api-key", help="the server's token")
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="eclectus backend: run chains eagerly, without compile()",
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    for name in COMMON_FLAGS:
        kind = float if name == "rate" else int
        parser.add_argument("--" + name.replace("_", "-"), type=kind, dest=name)
    parser.add_argument("--output-tokens", type=int, help="tokens per step's output")
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="any params field (repeatable)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def build_params(args: argparse.Namespace) -> Any:
    """The recipe's params dataclass from the flags, each ``--param`` value parsed by its
    field's declared type (pure; ValueError naming the field for an unknown field or a
    value of the wrong type)."""
    params_type = RECIPES[args.name].params_type
    names = {f.name for f in dataclasses.fields(params_type)}
    changes: dict[str, Any] = {
        n: getattr(args, n) for n in COMMON_FLAGS if getattr(args, n) is not None and n in names
    }
    if args.output_tokens is not None:
        changes[OUTPUT_FIELD[args.name]] = args.output_tokens
    params = params_type(**changes)
    for item in args.param:
        path, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"--param takes FIELD=VALUE, got {item!r}")
        try:
            params = set_from_text(params, path, text)
        except ValueError as exc:
            raise ValueError(f"--param {item!r}: {exc}") from exc
    return params


def remote_target(args: argparse.Namespace) -> Target | None:
    """The target named by the flags, or None for the embedded server (pure)."""
    if args.backend == "openai" and args.base_url:
        return Target("openai", args.base_url, args.model, args.api_key, args.metrics_url)
    if args.server:
        if args.backend == "openai":
            raise ValueError("--backend openai takes --base-url, not --server")
        parts = urlparse(args.server)
        scheme = "https" if parts.scheme in ("wss", "https") else "http"
        metrics = f"{scheme}://{parts.netloc}/metrics"
        return Target(
            "eclectus",
            args.server,
            args.model,
            args.api_key,
            metrics,
            use_compile=not args.no_compile,
        )
    return None


def run(args: argparse.Namespace) -> int:
    """Run the recipe and print the report to stdout; 2 on bad flags."""
    try:
        params = build_params(args)
        target = remote_target(args)
    except (TypeError, ValueError) as exc:
        print(f"eclectus run: {exc}", file=sys.stderr)
        return 2
    text = load_input(args.input) if args.input else None
    if args.sample:
        text = load_sample(args.sample)
    common = dict(text=text, temperature=args.temperature, progress=not args.quiet)
    if target is not None:
        result = run_recipe(args.name, params, target, **common)
    else:
        print(f"starting the embedded server (model {args.model})...", file=sys.stderr)
        with embedded_server(args.model) as embedded:
            target = embedded.target(args.backend, use_compile=not args.no_compile)
            result = run_recipe(args.name, params, target, **common)
    print(format_report(result))
    return 0
