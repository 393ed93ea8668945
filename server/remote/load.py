"""An engine's load as its ``/metrics`` page reports it (vLLM, SGLang, Eclectus names).

Each engine's counts are summed over label sets (a data-parallel vLLM reports one series per
engine core); the KV usage is the largest reported fraction. An engine that exports none of
these names gets an empty :class:`EngineLoad` and the pool routes on its own in-flight counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "eclectus_engine_running")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "eclectus_engine_waiting")
# vLLM V1 renamed gpu_cache_usage_perc to kv_cache_usage_perc; both are fractions in [0, 1]
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
PREEMPTIONS = ("vllm:num_preemptions_total", "eclectus_engine_preemptions_total")
CACHE_INFO = "vllm:cache_config_info"  # its labels say the KV cache's size
LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """Requests running and waiting in the engine (all its clients, not only us) and the
    fraction of its KV cache in use; None where the engine does not say."""

    num_running: int | None = None
    num_waiting: int | None = None
    kv_usage: float | None = None
    kv_tokens: int | None = None  # the KV cache's size in tokens (vLLM: cache_config_info)
    num_preemptions: int | None = None  # requests the engine preempted so far
    # its block size where it caches prefixes (cache_config_info's block_size with
    # enable_prefix_caching True): requests it runs at once share their common full blocks
    shared_block_size: int | None = None


def parse_load(text: str) -> EngineLoad:
    """The load a Prometheus text page reports (pure)."""
    sums: dict[str, float] = {}
    kv_tokens = None
    shared: set[int | None] = set()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        if name == CACHE_INFO:
            labels = dict(LABEL.findall(name_part))
            kv_tokens = (kv_tokens or 0) + _cache_tokens(labels)
            shared.add(_shared_block_size(labels))
        try:
            number = float(value)
        except ValueError:
            continue
        if name in KV_USAGE:
            sums[name] = max(sums.get(name, 0.0), number)
        else:
            sums[name] = sums.get(name, 0.0) + number
    return EngineLoad(
        num_running=_first_int(sums, RUNNING),
        num_waiting=_first_int(sums, WAITING),
        kv_usage=next((sums[n] for n in KV_USAGE if n in sums), _eclectus_usage(sums)),
        kv_tokens=kv_tokens or None,
        num_preemptions=_first_int(sums, PREEMPTIONS),
        shared_block_size=shared.pop() if len(shared) == 1 else None,
    )


def _cache_tokens(labels: dict[str, str]) -> int:
    """Tokens of KV cache one ``cache_config_info`` sample's labels describe (pure): its
    blocks (``num_gpu_blocks``, vLLM's name on every device) times their size; 0 when a
    label is missing or not a number."""
    try:
        return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    except (KeyError, ValueError):
        return 0


def _shared_block_size(labels: dict[str, str]) -> int | None:
    """The block size one ``cache_config_info`` sample's labels share prefixes at: its
    ``block_size`` where ``enable_prefix_caching`` is True, else None (pure)."""
    if labels.get("enable_prefix_caching") != "True":
        return None
    try:
        return int(labels["block_size"])
    except (KeyError, ValueError):
        return None


def _first_int(sums: dict[str, float], names: tuple[str, ...]) -> int | None:
    return next((round(sums[n]) for n in names if n in sums), None)


def _eclectus_usage(sums: dict[str, float]) -> float | None:
    total = sums.get("eclectus_engine_total_blocks")
    free = sums.get("eclectus_engine_free_blocks")
    if not total or free is None:
        return None
    return 1.0 - free / total
