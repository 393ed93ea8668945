"""The client side stands alone: the SDK and both framework adapters import nothing from
``eclectus.server`` (a client-only install needs no torch and no engine), and the engine
contract ``eclectus.server.backend`` does not pull the engine in."""

from __future__ import annotations

from pathlib import Path

from import_scan import imported_names, modules_after_import, package_of

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


def test_adapter_packages_load_no_server_module() -> None:
    """Importing the SDK and both adapters loads no eclectus.server module (and no torch)."""
    loaded = modules_after_import(*CLIENT_PACKAGES)
    assert [m for m in loaded if m.startswith("eclectus.server")] == []
    assert "torch" not in loaded


# what the Backend contract takes from the engine package: its torch-free request types
# (the engine owns them), its block-hash chain (stdlib only: admission keys a prompt's blocks
# as the engine's prefix cache does, docs/architecture.md "Admission") and the package's own
# light __init__
ENGINE_CONTRACT = {
    "eclectus.server.engine",
    "eclectus.server.engine.engine_config",
    "eclectus.server.engine.prefix_cache",
    "eclectus.server.engine.request",
}


def test_backend_contract_loads_no_engine() -> None:
    """eclectus.server.backend (the scheduler's view of an engine) and the remote backend
    load the engine's request types and nothing else of it, and no torch."""
    for module in ("eclectus.server.backend", "eclectus.server.remote.backend"):
        loaded = modules_after_import(module)
        assert {m for m in loaded if m.startswith("eclectus.server.engine")} <= ENGINE_CONTRACT
        assert "torch" not in loaded, module


# what the adapters must never import: the server, and the benchmarks, which start one
FORBIDDEN = (("eclectus", "server"), ("eclectus", "benchmarks"))


def forbidden_imports(source: str, package: list[str]) -> list[str]:
    """The ``eclectus.server`` / ``eclectus.benchmarks`` modules ``source`` (a module of
    ``package``) imports anywhere, relative imports resolved (pure)."""
    names = imported_names(source, package)
    return [n for n in names if tuple(n.split(".")[:2]) in FORBIDDEN]


def test_adapter_sources_never_import_the_server() -> None:
    """No adapter source imports eclectus.server (or the benchmarks, which start it), even
    lazily inside a function or by a relative import. No file is exempt: the benchmarks
    that start an in-process server live in benchmarks/ (eclectus.benchmarks)."""
    offenders = {
        str(path.relative_to(ADAPTERS)): names
        for path in sorted(ADAPTERS.rglob("*.py"))
        if (
            names := forbidden_imports(
                path.read_text(), package_of(path, ADAPTERS, "eclectus.adapters")
            )
        )
    }
    assert offenders == {}
    assert not sorted(ADAPTERS.rglob("bench*.py"))


def test_the_check_sees_lazy_and_relative_imports() -> None:
    """The scan is not fooled by an import inside a function or a relative one."""
    source = "def f():\n    from ...server import app\n    import eclectus.benchmarks.server\n"
    package = ["eclectus", "adapters", "client"]
    assert forbidden_imports(source, package) == [
        "eclectus.benchmarks.server",
        "eclectus.server.app",
    ]
    assert forbidden_imports("from . import connect\nfrom .. import calls\n", package) == []
