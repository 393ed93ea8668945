"""Fixtures every test folder may use."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest


@pytest.fixture
def backend_choice() -> Iterator[contextlib.ExitStack]:
    """Holds the test's ``kernels.dispatch.force_backend`` choices; unwound after it."""
    with contextlib.ExitStack() as stack:
        yield stack
