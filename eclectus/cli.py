"""The ``eclectus`` command. Each subcommand lives with what it runs; this file routes, and
turns a user's everyday mistake into one line on stderr (see :mod:`eclectus.cli_errors`)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from eclectus.cli_errors import run_guarded

DESCRIPTION = """\
Eclectus serves multi-call LLM applications (map-reduce, refine chains, agent teams, chats
sharing a long prompt) as graphs, so the server runs dependent calls without client round
trips, schedules for the answer you wait on, and computes a shared prefix once.

first steps:
  eclectus demo                          a map-reduce graph on a local server, and what it saw
  eclectus serve                         serve the built-in `tiny` model on ws://127.0.0.1:8765
  eclectus run map-reduce                a recipe (an ordinary LangChain app) on `tiny`

`eclectus COMMAND --help` lists a command's flags and their defaults."""

# subcommand -> (module, help). Each module has add_arguments(parser) and run(args) -> int;
# modules are imported only when their subcommand runs, so `eclectus --help` stays light.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("eclectus.server.main", "start the Eclectus server"),
    "model": ("eclectus.models.presets", "export a built-in model as a HF directory"),
    "demo": ("eclectus.demo", "run a map-reduce graph on a local server and report"),
    "run": ("eclectus.recipes.cli", "run a recipe (map-reduce, chain-summary, ...) and report"),
    "eval": ("eclectus.evals.cli", "compare a workload on Eclectus and baselines (vLLM, ...)"),
}
# `eclectus eval load`: many programs at once, a command of its own under `eval`
NESTED: dict[tuple[str, str], str] = {("eval", "load"): "eclectus.evals.load.cli"}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; each flag's default after its help, unless it has none to
    show (None, off, an empty list) or its help already speaks of its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or "default" in text  # its help says it in words
            or default in (None, False, argparse.SUPPRESS)
            or default == []
        ):
            return text
        return f"{text} (default: %(default)s)"


def add_debug_flag(parser: argparse.ArgumentParser, default: object = False) -> None:
    """``--debug``: show the traceback of an error instead of its one line (mutates
    ``parser``)."""
    parser.add_argument(
        "--debug",
        action="store_true",
        default=default,
        help="on an error, show the full traceback instead of one line",
    )


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser, with arguments only for the subcommand named in ``argv`` (if any): only
    that module is imported, so `eclectus model export` does not pay for the server."""
    positional = [arg for arg in argv if not arg.startswith("-")]
    chosen = positional[0] if positional else None
    nested = NESTED.get((chosen or "", positional[1] if len(positional) > 1 else ""))
    parser = argparse.ArgumentParser(
        prog="eclectus", description=DESCRIPTION, formatter_class=HelpFormatter
    )
    add_debug_flag(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        child = sub.add_parser(
            name, help=help_text, description=help_text, formatter_class=HelpFormatter
        )
        add_debug_flag(child, default=argparse.SUPPRESS)  # `eclectus --debug run` also works
        if name == chosen:
            module = importlib.import_module(nested or module_name)
            module.add_arguments(child)
            child.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    return run_guarded(f"eclectus {args.command}", run, args, debug=args.debug)
