"""The serving budgets every system under test gets alike."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class Budget:
    """One engine's limits, given the same to Eclectus's engine (as the ``eclectus serve``
    flags of the same names) and to vLLM.

    ``block_size``: tokens per KV block (vLLM's CPU backend takes multiples of 32).
    ``kv_cache_gib``: the KV pool (vLLM's ``VLLM_CPU_KVCACHE_SPACE`` takes whole GiB).
    ``max_num_batched_tokens`` / ``max_num_seqs``: the per-step token and sequence budgets.
    ``num_threads``: torch threads of the model worker (vLLM on CPU binds one per core it
    is given; both systems get the same count).
    ``num_kv_blocks``: the KV pool in blocks exactly, over ``kv_cache_gib`` (vLLM's
    ``--num-gpu-blocks-override``, Eclectus's ``--num-kv-blocks``); None: from the GiB. A
    small pool makes the engine's KV capacity, not its step, limit the batch, as a large
    model's does on a GPU (Parrot's "latency-oriented" vLLM held 4,096 tokens).
    """

    block_size: int = 32
    kv_cache_gib: int = 1
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    num_threads: int = 1
    num_kv_blocks: int | None = None

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size % 32:
            raise ValueError(f"block_size must be a positive multiple of 32, got {self.block_size}")
        for name in ("kv_cache_gib", "max_num_batched_tokens", "max_num_seqs", "num_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be >= 1")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per field, named as ``eclectus serve`` names it (mutates ``parser``)."""
        for f in fields(cls):
            parser.add_argument(
                "--" + f.name.replace("_", "-"),
                type=int,
                default=f.default,
                help=f"every engine's {f.name} (the budget all systems get alike)",
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Budget:
        """The budget the flags describe (pure; ValueError from the checks above)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    def serve_args(self) -> list[str]:
        """The ``eclectus serve`` flags that size an Eclectus engine to this budget (pure)."""
        return [
            part
            for name, value in self.as_dict().items()
            if value is not None
            for part in (f"--{name.replace('_', '-')}", str(value))
        ]

    def vllm_args(self) -> list[str]:
        """The vLLM flags that size its engine to this budget, beside the environment's
        ``VLLM_CPU_KVCACHE_SPACE`` and ``OMP_NUM_THREADS`` (pure)."""
        args = [
            "--block-size",
            str(self.block_size),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--max-num-batched-tokens",
            str(self.max_num_batched_tokens),
        ]
        if self.num_kv_blocks is not None:
            args += ["--num-gpu-blocks-override", str(self.num_kv_blocks)]
        return args

    def as_dict(self) -> dict[str, Any]:
        """The budget as plain data, for results.json (pure)."""
        return asdict(self)
