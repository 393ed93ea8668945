"""The runner's KV pool: zeroed, and in 2 MiB pages where Linux allows them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from eclectus.server.engine.model_runner import HUGE_PAGE, kv_pool

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _huge_bytes_at(address: int) -> int:
    """AnonHugePages of the mapping of this process that holds ``address`` (bytes)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1]) * 1024
    return 0


def test_the_pool_is_zeroed_with_the_shape_and_dtype_asked() -> None:
    pool = kv_pool((2, 3, 2, 4, 8), torch.float32, torch.device("cpu"))
    assert pool.shape == (2, 3, 2, 4, 8) and pool.dtype == torch.float32
    assert not pool.any()


@pytest.mark.skipif(
    sys.platform != "linux" or not THP.exists() or "[never]" in THP.read_text(),
    reason="transparent huge pages unavailable",
)
def test_a_large_pool_lies_in_huge_pages() -> None:
    """16 MiB of pool: the advice takes, and its middle is backed by 2 MiB pages."""
    pool = kv_pool((4, 1024, 1024), torch.float32, torch.device("cpu"))
    assert _huge_bytes_at(pool.data_ptr() + 8 * HUGE_PAGE // 2) >= HUGE_PAGE
