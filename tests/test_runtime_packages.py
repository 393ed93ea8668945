"""The runtime packages hold runtime code: ``adapters/``, ``server/``, ``kernels/`` and
``eclectus/protocol/`` (what serves a request or sends one) hold no benchmark, demo, load
test or training module, and import none, wherever it lives. Benchmarks and load tests live
in ``benchmarks/`` (eclectus.benchmarks), the tiny model's training code in ``training/``
(eclectus.training), the demo beside the CLI (eclectus.demo). No file is exempt."""

from __future__ import annotations

from pathlib import Path

from import_scan import imported_names, modules_after_import, package_of

ROOT = Path(__file__).resolve().parents[1]
# folder -> the package it is (pyproject.toml's package-dir)
RUNTIME = {
    "adapters": "eclectus.adapters",
    "server": "eclectus.server",
    "kernels": "eclectus.kernels",
    "eclectus/protocol": "eclectus.protocol",
}
# a word of a module's name that says it is tooling, not runtime ("corpus": the training
# text). Words are the parts of a dotted name split at "_", so "step_bench" and
# "eclectus.benchmarks.x" are tooling and "constraints" is not.
TOOLING_WORDS = {
    *("bench", "benchmark", "benchmarks", "loadtest", "demo", "train", "training", "corpus")
}


def is_tooling(dotted: str) -> bool:
    """Whether a module's dotted name (or file stem) names tooling (pure)."""
    return any(word in TOOLING_WORDS for part in dotted.split(".") for word in part.split("_"))


def runtime_sources() -> list[tuple[Path, list[str]]]:
    """Every runtime source file with the package its relative imports start from."""
    return [
        (path, package_of(path, ROOT / folder, top))
        for folder, top in RUNTIME.items()
        for path in sorted((ROOT / folder).rglob("*.py"))
    ]


def test_runtime_packages_hold_no_tooling_module() -> None:
    """No bench, demo, load-test or training file (or folder) under a runtime package."""
    found = [
        str(path.relative_to(ROOT))
        for path, _ in runtime_sources()
        if is_tooling(".".join(path.relative_to(ROOT).with_suffix("").parts))
    ]
    assert found == []


def test_runtime_sources_import_no_tooling() -> None:
    """No runtime source imports a benchmark, the demo or training code, not lazily inside a
    function, not by a relative import, not from its old place."""
    offenders = {
        str(path.relative_to(ROOT)): names
        for path, package in runtime_sources()
        if (names := [n for n in imported_names(path.read_text(), package) if is_tooling(n)])
    }
    assert offenders == {}


def test_the_scan_sees_tooling_by_any_import() -> None:
    """A lazy, relative or old-place import of tooling is seen; runtime names are not."""
    source = (
        "from .engine import step_bench\n"
        "def f():\n"
        "    from ..benchmarks.engine import step\n"
        "    import eclectus.training.tiny_tools\n"
        "from . import constraints, demos_of_nothing\n"
    )
    names = [n for n in imported_names(source, ["eclectus", "server"]) if is_tooling(n)]
    assert names == [
        "eclectus.benchmarks.engine.step",
        "eclectus.server.engine.step_bench",
        "eclectus.training.tiny_tools",
    ]
    assert is_tooling("eclectus.server.loadtest") and is_tooling("server.engine.train_tiny")
    assert not is_tooling("eclectus.server.graph.scheduler")


def test_serving_loads_no_tooling_module() -> None:
    """What ``eclectus serve`` imports to start (the server's entry point, its app, the
    engine, the kernels, the remote backend) loads no tooling module."""
    modules = [
        "eclectus.server.main",
        "eclectus.server.front.app",
        "eclectus.server.engine.async_engine",
        "eclectus.server.remote.backend",
        "eclectus.kernels",
        "eclectus.adapters.client",
    ]
    loaded = modules_after_import(*modules)
    assert [m for m in loaded if m.startswith("eclectus.") and is_tooling(m)] == []
