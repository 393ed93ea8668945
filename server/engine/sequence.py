"""A request inside the engine: its tokens, its progress and its blocks."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from eclectus.protocol.sampling import SamplingParams
from eclectus.server.engine.prefix_cache import BlockHash


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # never scheduled yet
    RUNNING = "running"  # holds blocks; scheduled every step until finished
    PREEMPTED = "preempted"  # blocks freed; waits to be recomputed
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"  # eos, a stop token or a stop string
    LENGTH = "length"  # max_tokens or the context window
    ABORT = "abort"  # aborted by the caller
    ERROR = "error"  # the engine failed the request


@dataclass(slots=True, eq=False)
class Sequence:
    """One request's state. The scheduler and block manager mutate it; nothing else does.

    vLLM v1 model: ``token_ids`` = prompt + output so far; ``num_computed_tokens`` of them have
    KV in the cache (cache hits included). There are no prefill/decode phases: each step
    computes some of the remaining ``len(token_ids) - num_computed_tokens`` tokens, and a
    token is sampled when a step reaches the end of ``token_ids``.
    """

    request_id: str
    token_ids: list[int]
    sampling: SamplingParams
    arrival: int  # admission order among equal priorities
    priority: float = 0.0
    background: bool = False  # throughput work: held back while foreground work runs
    tenant: str | None = None
    pin_prefix_tokens: int = 0  # leading prompt tokens to pin once computed (0: none)
    max_total_tokens: int = 1 << 30  # context window: finish with "length" when reached
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at first admission
    num_preemptions: int = 0
    block_table: list[int] = field(default_factory=list)  # physical block ids, in order
    block_hashes: list[BlockHash] = field(default_factory=list)  # of full blocks, in order
    generator: Any = None  # torch.Generator of a seeded request (sampler state)
    num_prompt_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def pinned_prefix_tokens(self) -> int:
        """Leading prompt tokens to keep pinned (0: no pin); at most the prompt."""
        return max(0, min(self.pin_prefix_tokens, self.num_prompt_tokens))

    def finish(self, reason: FinishReason) -> None:
        """Mark finished (mutates). The engine frees the blocks."""
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
