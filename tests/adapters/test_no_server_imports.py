"""The client side stands alone: the SDK and both framework adapters import nothing from
``eclectus.server`` (a client-only install needs no torch and no engine), and the engine
contract ``eclectus.server.backend`` does not pull the engine in."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import eclectus.adapters

ADAPTERS = Path(eclectus.adapters.__file__).parent
CLIENT_PACKAGES = (
    "eclectus.adapters.client",
    "eclectus.adapters.connection",
    "eclectus.adapters.calls",
    "eclectus.adapters.sampling",
    "eclectus.adapters.langchain",
    "eclectus.adapters.langchain.compiler",
    "eclectus.adapters.llamaindex",
)


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


def test_adapter_packages_load_no_server_module() -> None:
    """Importing the SDK and both adapters loads no eclectus.server module (and no torch)."""
    loaded = modules_after_import(*CLIENT_PACKAGES)
    assert [m for m in loaded if m.startswith("eclectus.server")] == []
    assert "torch" not in loaded


def test_backend_contract_loads_no_engine() -> None:
    """eclectus.server.backend (the scheduler's view of an engine) leaves the engine out."""
    loaded = modules_after_import("eclectus.server.backend")
    assert [m for m in loaded if m.startswith("eclectus.server.engine")] == []


def server_imports(path: Path) -> list[str]:
    """The ``eclectus.server`` modules a source file imports anywhere (pure)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return [name for name in found if name.split(".")[:2] == ["eclectus", "server"]]


def test_adapter_sources_never_import_the_server() -> None:
    """No adapter source imports eclectus.server, even lazily inside a function; only the
    benchmarks (``adapters/*/bench.py``), which start an in-process server on purpose, do,
    through one helper (adapters/bench_server.py)."""
    offenders = {
        str(path.relative_to(ADAPTERS)): names
        for path in sorted(ADAPTERS.rglob("*.py"))
        if path.name not in ("bench.py", "bench_server.py") and (names := server_imports(path))
    }
    assert offenders == {}


def test_benchmarks_reach_the_server_through_one_helper() -> None:
    """The benchmarks import no eclectus.server module themselves."""
    benches = sorted(ADAPTERS.glob("*/bench.py"))
    assert benches
    assert {str(p.relative_to(ADAPTERS)): server_imports(p) for p in benches} == {
        str(p.relative_to(ADAPTERS)): [] for p in benches
    }
