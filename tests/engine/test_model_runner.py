"""The runner's KV pool: zeroed, and in 2 MiB pages where Linux allows them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from eclectus.server.engine.model_runner import HUGE_PAGE, kv_pool

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _mapping_at(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping of this process that holds ``address``."""
    fields: dict[str, str] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head, _, rest = line.partition(" ")
        if "-" in head and not head.endswith(":"):
            if inside:
                break
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside:
            fields[head.rstrip(":")] = rest.strip()
    return fields


def test_the_pool_is_zeroed_with_the_shape_and_dtype_asked() -> None:
    pool = kv_pool((2, 3, 2, 4, 8), torch.float32, torch.device("cpu"))
    assert pool.shape == (2, 3, 2, 4, 8) and pool.dtype == torch.float32
    assert not pool.any()


@pytest.mark.skipif(
    sys.platform != "linux" or not THP.exists() or "[never]" in THP.read_text(),
    reason="transparent huge pages unavailable",
)
def test_a_large_pool_is_advised_into_huge_pages() -> None:
    """16 MiB of pool: its middle lies in a mapping that carries the huge-page advice (``hg``).

    Whether the kernel then backs it with 2 MiB pages depends on free, unfragmented memory at
    that moment (THP ``defrag`` is ``madvise`` here: it falls back to small pages when
    compaction finds none), so the test checks what the code does: the advice."""
    pool = kv_pool((4, 1024, 1024), torch.float32, torch.device("cpu"))
    mapping = _mapping_at(pool.data_ptr() + 8 * HUGE_PAGE // 2)
    assert "hg" in mapping["VmFlags"].split(), mapping.get("VmFlags")
