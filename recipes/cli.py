"""``eclectus run NAME``: run one recipe and print a short report.

    eclectus run map-reduce                          # embedded server, built-in tiny model
    eclectus run chain-summary --input notes.md      # your document
    eclectus run multi-agent --server ws://host:8765 --files 4 --rounds 3
    eclectus run map-reduce --backend openai --base-url http://host:8000/v1 --model NAME
    eclectus run shared-prompt --param users=16 --param rate=2.5
    eclectus run plan-execute --steps 8              # a LangGraph app, compiled
    eclectus run plan-execute-json --steps 8         # its plan as JSON, fanned out on the server
    eclectus run multi-agent-json --files 4          # the team, its file list as JSON: one frame
    eclectus run tool-agent --param tool_rounds=4    # a LangGraph tool-using agent

Sizes: the common flags below, or ``--param FIELD=VALUE`` for any field of the recipe's
params dataclass (docs/recipes.md lists them).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any
from urllib.parse import urlparse

from eclectus.adapters.client import connect_sync
from eclectus.cli_errors import CommandError, refused_connection
from eclectus.recipes.embedded import embedded_server
from eclectus.recipes.fit import fit_num_chunks, fit_system_prompt
from eclectus.recipes.params import set_from_text
from eclectus.recipes.result import RecipeResult, format_report
from eclectus.recipes.runner import RECIPES, run_recipe
from eclectus.recipes.shared_prompt import SharedPromptParams, handbook_and_rest
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
    "multi-agent-json": "code_tokens",
    "plan-execute-json": "step_tokens",
    "tool-agent": "answer_tokens",
}
# the common size flags, and their help (each sets the params field of its name, where the
# recipe has one; the recipe's default applies when a flag is not given)
COMMON_FLAGS = {
    "chunk_tokens": "tokens per document chunk (map-reduce, chain-summary)",
    "num_chunks": "chunks to read (map-reduce, chain-summary; default: the recipe's, at most "
    "what the document gives)",
    "files": "files the engineers write (multi-agent)",
    "rounds": "review rounds (multi-agent)",
    "rate": "chat requests per second (shared-prompt)",
    "users": "chat users (shared-prompt)",
    "requests": "chat requests in all (shared-prompt)",
    "steps": "plan steps (plan-execute, plan-execute-json)",
}


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
        help="eclectus: the app's calls as graphs; openai: the stock way, one prompt a request",
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
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)"
    )
    for name, help_text in COMMON_FLAGS.items():
        kind = float if name == "rate" else int
        parser.add_argument("--" + name.replace("_", "-"), type=kind, dest=name, help=help_text)
    parser.add_argument("--output-tokens", type=int, help="tokens of each step's output")
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


def given_fields(args: argparse.Namespace) -> set[str]:
    """The params fields (dotted paths) the user set on the command line (pure)."""
    given = {n for n in COMMON_FLAGS if getattr(args, n) is not None}
    given |= {item.partition("=")[0] for item in args.param}
    if args.output_tokens is not None:
        given.add(OUTPUT_FIELD[args.name])
    return given


def read_text(args: argparse.Namespace) -> str:
    """The document: ``--input``, ``--sample``, else the recipe's own sample (reads disk)."""
    if args.input:
        return load_input(args.input)
    return load_sample(args.sample or RECIPES[args.name].sample)


def fit_to_text(args: argparse.Namespace, params: Any, text: str, notes: list[str]) -> Any:
    """``params`` with the chunk counts the document can give (see :mod:`.fit`)."""
    given = given_fields(args)
    if isinstance(params, SharedPromptParams):
        if params.background is None:
            return params
        _, rest = handbook_and_rest(params, text)
        given_here = "background.num_chunks" in given or "num_chunks" in given
        return fit_num_chunks(params, rest, "background", given_here, notes)
    if hasattr(params, "num_chunks"):
        return fit_num_chunks(params, text, "", "num_chunks" in given, notes)
    return params


def fit_to_model(
    args: argparse.Namespace, params: Any, text: str, url: str, notes: list[str]
) -> Any:
    """``params`` whose prompts fit the model served at ``url`` (an Eclectus server: its
    tokenizer counts, its context window and prompt limit bound) (blocking I/O)."""
    if not isinstance(params, SharedPromptParams):
        return params
    with connect_sync(url, token=args.api_key) as app:
        limit = min(app.models[0].context_window, app.limits.max_prompt_tokens)
        given = "system_tokens" in given_fields(args)
        return fit_system_prompt(params, text, limit, app.count_tokens, given, notes)


def _run_remote(
    args: argparse.Namespace, params: Any, target: Target, text: str, notes: list[str]
) -> RecipeResult:
    """The recipe on a server the user named; an unreachable one is one line."""
    try:
        if target.backend == "eclectus":
            params = fit_to_model(args, params, text, target.url, notes)
        _print_notes(notes)
        return run_recipe(args.name, params, target, **_run_kwargs(args, text))
    except Exception as exc:
        if not refused_connection(exc):
            raise
        flag = "--server" if target.backend == "eclectus" else "--base-url"
        raise CommandError(
            f"cannot reach {target.url} ({flag}): is the server running there? Start it "
            f"(`eclectus serve`), or fix {flag}"
        ) from exc


def _run_kwargs(args: argparse.Namespace, text: str) -> dict[str, Any]:
    return dict(text=text, temperature=args.temperature, progress=not args.quiet)


def run(args: argparse.Namespace) -> int:
    """Run the recipe and print the report to stdout; 2 on bad flags or sizes the document
    or the model cannot take (errors reach the user through eclectus.cli_errors)."""
    try:
        params = build_params(args)
        target = remote_target(args)
    except (TypeError, ValueError) as exc:
        print(f"eclectus run: {exc}", file=sys.stderr)
        return 2
    text = read_text(args)
    notes: list[str] = []
    params = fit_to_text(args, params, text, notes)
    if target is not None:
        result = _run_remote(args, params, target, text, notes)
    else:
        print(f"starting the embedded server (model {args.model})...", file=sys.stderr)
        with embedded_server(args.model) as embedded:
            params = fit_to_model(args, params, text, embedded.server.url, notes)
            _print_notes(notes)
            target = embedded.target(args.backend, use_compile=not args.no_compile)
            result = run_recipe(args.name, params, target, **_run_kwargs(args, text))
    print(format_report(result))
    return 0


def _print_notes(notes: list[str]) -> None:
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
