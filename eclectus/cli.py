"""The ``eclectus`` command. Each subcommand lives with what it runs; this file only routes.

    eclectus serve --host 127.0.0.1 --port 8765 --model tiny   (server/main.py)
    eclectus model export tiny DIR                              (server/engine/presets.py)
    eclectus demo                                               (server/demo.py)
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence

# subcommand -> (module, help). Each module has add_arguments(parser) and run(args) -> int;
# modules are imported only when their subcommand runs, so `eclectus --help` stays light.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("eclectus.server.main", "start the Eclectus server"),
    "model": ("eclectus.server.engine.presets", "export a built-in model as a HF directory"),
    "demo": ("eclectus.server.demo", "run a map-reduce graph on a local server and report"),
    "run": ("eclectus.recipes.cli", "run a recipe (map-reduce, chain-summary, ...) and report"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eclectus", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        child = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(child)
        child.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    return run(args)
