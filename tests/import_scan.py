"""What a source file imports, read from its syntax tree (a helper of the import-boundary
tests, at the tests root, imported as ``import_scan`` like ``tool_fixtures``)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path


def package_of(path: Path, root: Path, top: str) -> list[str]:
    """The dotted package that ``path``'s relative imports start from, where the folder
    ``root`` is the package ``top`` (pure): a module's package; an ``__init__``'s own."""
    parts = [*top.split("."), *path.relative_to(root).with_suffix("").parts]
    return parts[:-1]  # "pkg/mod.py" -> pkg, "pkg/__init__.py" -> pkg the same way


def imported_names(source: str, package: list[str]) -> list[str]:
    """Every dotted name ``source`` (a module of ``package``) imports, anywhere in it (a
    lazy import inside a function too), relative imports resolved; a ``from M import n``
    gives ``M.n`` (pure)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            names = base + (node.module.split(".") if node.module else [])
            found += [".".join([*names, alias.name]) for alias in node.names]
    return sorted(set(found))


def modules_after_import(*names: str) -> list[str]:
    """sys.modules of a fresh interpreter after importing ``names``."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(names)!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])
