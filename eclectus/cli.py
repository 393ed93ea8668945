"""The ``eclectus`` command. Each subcommand lives with what it runs; this file only routes.

eclectus serve --host 127.0.0.1 --port 8765 --model tiny   (server/main.py)
eclectus model export tiny DIR                              (server/engine/presets.py)
eclectus demo                                               (server/demo.py)
eclectus run map-reduce                                     (recipes/cli.py)
eclectus eval map-reduce --quick                            (evals/cli.py)
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

# subcommand -> (module, help). Each module has add_arguments(parser) and run(args) -> int;
# modules are imported only when their subcommand runs, so `eclectus --help` stays light.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("eclectus.server.main", "start the Eclectus server"),
    "model": ("eclectus.server.engine.presets", "export a built-in model as a HF directory"),
    "demo": ("eclectus.server.demo", "run a map-reduce graph on a local server and report"),
    "run": ("eclectus.recipes.cli", "run a recipe (map-reduce, chain-summary, ...) and report"),
    "eval": ("eclectus.evals.cli", "compare a workload on Eclectus and baselines (vLLM, ...)"),
}


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser, with arguments only for the subcommand named in ``argv`` (if any): only
    that module is imported, so `eclectus model export` does not pay for the server."""
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    parser = argparse.ArgumentParser(prog="eclectus", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        child = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(child)
            child.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    return run(args)
