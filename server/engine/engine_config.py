"""EngineConfig: every knob of the built-in engine in one frozen, validated dataclass (how the
engine runs a model; the model's own architecture is ``model_config.ModelConfig``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from eclectus.protocol.kv_events import KVEventsConfig
from eclectus.server.engine.request import EngineCapacity

MiB = 1 << 20
GiB = 1 << 30
# the model and KV-cache dtypes the engine runs, with the bytes one element takes
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SUPPORTED_DTYPES = tuple(DTYPE_BYTES)
# the whitespace JSON constraints allow between tokens (server/engine/json_layout.py)
JsonWhitespace = Literal["bounded", "any", "compact"]
JSON_WHITESPACE: tuple[JsonWhitespace, ...] = ("bounded", "any", "compact")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Configuration of one engine instance. Defaults serve a laptop CPU.

    The KV pool is sized once at start: ``num_kv_blocks`` when given (tests force tiny pools
    with it), else ``kv_cache_bytes`` divided by the bytes one block takes over all layers
    (2 * num_layers * block_size * num_kv_heads * head_dim * dtype size).
    """

    model: str = "tiny"  # preset name or a HF-format directory
    dtype: str = "float32"  # "float32" | "bfloat16" | "float16"
    device: str = "cpu"
    block_size: int = 16  # tokens per KV block
    kv_cache_bytes: int = 512 * MiB  # KV pool budget, all layers, K and V
    num_kv_blocks: int | None = None  # overrides kv_cache_bytes when set
    max_num_batched_tokens: int = 2048  # per-step token budget (prefill chunks + decodes)
    max_num_seqs: int = 128  # most requests in one step
    # most background (throughput) requests computed in one step while a foreground request
    # is running or waiting, so a latency-critical stream is not slowed by batch work that
    # was already running when it arrived; None: no limit
    max_background_seqs: int | None = 1
    max_model_len: int | None = None  # None: the model's context window
    enable_prefix_caching: bool = True
    cascade_attention: bool = True  # shared-prefix decode attention when it pays
    # Structured outputs, both off by default: each changes what a greedy request answers,
    # so with them on it is no longer what stock vLLM answers (docs/engine.md).
    # Append a grammar's forced continuation without sampling it (fewer steps, but the
    # grammar's tokenization of the forced text, not the model's choice of tokens):
    jump_forward: bool = False
    # Close the structure within max_tokens (a reply that would hit max_tokens unclosed
    # ends valid instead; near the budget it may end one that would have closed in time):
    budget_guarantee: bool = False
    # structured outputs: the whitespace JSON constraints allow between tokens (json_layout):
    # "bounded" (what JSON printers write: one line break at most per place), "any" (stock
    # vLLM's default) or "compact" (no whitespace between tokens, for every request: vLLM's
    # --structured-outputs-config disable_any_whitespace); a request may still ask for compact
    json_whitespace: JsonWhitespace = "bounded"
    num_threads: int | None = None  # torch threads on CPU; None: all cores but one
    seed: int = 0  # the generator of unseeded sampled requests
    # publish the prefix cache's changes as vLLM's KV events (--kv-events-config), so a
    # front routes by what this engine holds (server/engine/kv_publisher.py); None: off
    kv_events: KVEventsConfig | None = None

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.kv_cache_bytes < 1:
            raise ValueError(f"kv_cache_bytes must be >= 1, got {self.kv_cache_bytes}")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_background_seqs is not None and self.max_background_seqs < 1:
            raise ValueError("max_background_seqs must be >= 1 (None: no limit)")
        if self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError("num_threads must be >= 1")
        if self.kv_events is not None and self.kv_events.enabled and not self.enable_prefix_caching:
            raise ValueError("--kv-events-config needs prefix caching (it publishes its changes)")
        if self.json_whitespace not in JSON_WHITESPACE:
            raise ValueError(
                f"json_whitespace must be one of {', '.join(JSON_WHITESPACE)}, "
                f"not {self.json_whitespace!r}"
            )

    @property
    def compact_json(self) -> bool:
        """Whether every JSON constraint is compact (``--compact-json``)."""
        return self.json_whitespace == "compact"

    def capacity(self, num_total_blocks: int) -> EngineCapacity:
        """What an engine of this config with a pool of ``num_total_blocks`` holds at once,
        for the scheduler's admission (pure)."""
        kv_tokens = num_total_blocks * self.block_size
        shared = self.block_size if self.enable_prefix_caching else None
        return EngineCapacity(1, self.max_num_seqs, kv_tokens or None, shared)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EngineConfig:
        """Build from a mapping, rejecting unknown keys (pure)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown EngineConfig keys: {unknown}")
        return cls(**values)

    def replace(self, **changes: Any) -> EngineConfig:
        """A copy with ``changes`` applied (pure)."""
        return dataclasses.replace(self, **changes)
