"""The server's packages import downward only: the built-in engine never imports the server
above it, the remote pool never imports the built-in engine (what both need, the tokenizer
and the model directory, is the leaf ``eclectus.models``), and that leaf imports neither."""

from __future__ import annotations

import ast
from pathlib import Path

import eclectus.models
import eclectus.server

SERVER = Path(eclectus.server.__file__).parent
MODELS = Path(eclectus.models.__file__).parent


def imports(path: Path) -> set[str]:
    """The absolute modules a source file imports anywhere, lazily too (pure)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def offenders(folder: Path, allowed: str, forbidden: str) -> dict[str, list[str]]:
    """Files under ``folder`` importing a ``forbidden`` module outside ``allowed`` (pure)."""
    bad = {}
    for path in sorted(folder.rglob("*.py")):
        names = sorted(
            m
            for m in imports(path)
            if (m == forbidden or m.startswith(forbidden + "."))
            and not (m == allowed or m.startswith(allowed + "."))
        )
        if names:
            bad[str(path.relative_to(folder))] = names
    return bad


def test_the_engine_never_imports_the_server_above_it() -> None:
    """The engine owns its request types (engine/request.py), as vLLM's EngineCoreRequest
    lives with its engine: nothing under server/engine imports server/*."""
    assert offenders(SERVER / "engine", "eclectus.server.engine", "eclectus.server") == {}


def test_the_remote_pool_never_imports_the_builtin_engine() -> None:
    """server/remote takes the tokenizer and presets from eclectus.models and the request
    types through the Backend contract, never from server/engine."""
    assert offenders(SERVER / "remote", "-", "eclectus.server.engine") == {}


def test_the_models_leaf_imports_no_server() -> None:
    assert offenders(MODELS, "-", "eclectus.server") == {}
