"""One embedded Eclectus server (built-in engine, ``tiny`` model, both listeners) for the
recipe tests, started once per test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from eclectus.recipes.embedded import Embedded, embedded_server


@pytest.fixture(scope="session")
def embedded() -> Iterator[Embedded]:
    with embedded_server("tiny") as server:
        yield server
