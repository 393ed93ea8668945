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


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Runs a module's forwards on one torch thread (``pytestmark =
    pytest.mark.usefixtures("one_torch_thread")``). Why: on a busy 2-core machine torch's two
    OpenMP threads wait on each other and small GEMMs run ~10x slower; such tests check
    numerics, not speed."""
    import torch  # here: most test folders never load torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
