"""Runs one scheduled step through the model over the paged KV cache.

Per step: one flat batch of tokens (decodes first, then
prefill chunks) built from lists once, the attention plans built once, and one forward whose
every layer stores its K/V and attends through ``eclectus.kernels``. Only the rows that sample
get logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from eclectus import kernels
from eclectus.server.engine.config import ModelConfig
from eclectus.server.engine.engine_config import DTYPE_BYTES, EngineConfig
from eclectus.server.engine.model import LlamaForCausalLM
from eclectus.server.engine.scheduler import ScheduledSeq, SchedulerOutput


def num_kv_blocks(model_config: ModelConfig, config: EngineConfig) -> int:
    """Blocks in the pool: ``config.num_kv_blocks``, or the byte budget over one block's
    size in every layer, K and V (pure)."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    per_block = (
        2
        * model_config.num_hidden_layers
        * config.block_size
        * model_config.num_key_value_heads
        * model_config.head_dim
        * DTYPE_BYTES[config.dtype]
    )
    return max(1, config.kv_cache_bytes // per_block)


def _slots(block_table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Cache slots of token positions [start, end): built block by block (ranges run in C),
    not token by token."""
    first, last = start // block_size, (end - 1) // block_size
    slots: list[int] = []
    for block_id in block_table[first : last + 1]:
        base = block_id * block_size
        slots += range(base, base + block_size)
    offset = start - first * block_size
    return slots[offset : offset + end - start]


@dataclass(slots=True)
class StepAttention:
    """The AttentionFn of one step: plans built once, used by every layer.

    Rows [0, num_decodes) of q are decodes (one query per request), the rest prefill chunks.
    Calling it MUTATES the caches (stores this step's K/V before attending).
    """

    k_caches: Tensor  # [layers, num_blocks, Hkv, block_size, D]: head-major blocks
    v_caches: Tensor
    slot_mapping: Tensor  # int64 [T]
    num_decodes: int
    decode_plan: kernels.DecodePlan | None
    prefill_plan: kernels.PrefillPlan | None
    scale: float

    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        k_cache, v_cache = self.k_caches[layer_idx], self.v_caches[layer_idx]
        kernels.store_kv(k, v, k_cache, v_cache, self.slot_mapping)
        nd = self.num_decodes
        if self.prefill_plan is None:
            assert self.decode_plan is not None
            return kernels.decode_attention(q, k_cache, v_cache, self.decode_plan, self.scale)
        if self.decode_plan is None:
            return kernels.prefill_attention(q, k_cache, v_cache, self.prefill_plan, self.scale)
        o = torch.empty_like(q)
        o[:nd] = kernels.decode_attention(q[:nd], k_cache, v_cache, self.decode_plan, self.scale)
        o[nd:] = kernels.prefill_attention(q[nd:], k_cache, v_cache, self.prefill_plan, self.scale)
        return o


class ModelRunner:
    """Owns the model and the KV pool. :meth:`execute` mutates the cache."""

    def __init__(
        self, model: LlamaForCausalLM, model_config: ModelConfig, config: EngineConfig
    ) -> None:
        self.model, self.model_config, self.config = model, model_config, config
        self.device = torch.device(config.device)
        self.block_size = config.block_size
        self.num_blocks = num_kv_blocks(model_config, config)
        shape = (
            model_config.num_hidden_layers,
            self.num_blocks,
            model_config.num_key_value_heads,
            config.block_size,
            model_config.head_dim,
        )
        # zeros, not empty: masked-out slots still enter a 0 * v product, and 0 * NaN = NaN
        self.k_caches = torch.zeros(shape, dtype=model.dtype, device=self.device)
        self.v_caches = torch.zeros(shape, dtype=model.dtype, device=self.device)
        self.scale = model_config.head_dim**-0.5

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> tuple[list[ScheduledSeq], Tensor]:
        """Run the step. Returns the items that sample, in ``out.scheduled`` order, and their
        logits [num_sampling, vocab] fp32. Mutates the KV cache."""
        decodes = [s for s in out.scheduled if s.num_new_tokens == 1]
        prefills = [s for s in out.scheduled if s.num_new_tokens > 1]
        items = decodes + prefills
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_row: dict[int, int] = {}  # id(item) -> row of its last token
        bs = self.block_size
        for item in items:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_new_tokens
            input_ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += _slots(seq.block_table, start, end, bs)
            if item.samples:
                sample_row[id(item)] = len(input_ids) - 1
        attn = self._attention(decodes, prefills, slots)
        dev = self.device
        hidden = self.model(
            torch.tensor(input_ids, device=dev), torch.tensor(positions, device=dev), attn
        )
        sampling = [item for item in out.scheduled if item.samples]
        rows = torch.tensor(
            [sample_row[id(item)] for item in sampling], device=dev, dtype=torch.int64
        )
        return sampling, self.model.compute_logits(hidden[rows])

    def _attention(
        self, decodes: list[ScheduledSeq], prefills: list[ScheduledSeq], slots: list[int]
    ) -> StepAttention:
        bs, dev = self.block_size, self.device
        decode_plan = prefill_plan = None
        if decodes:
            decode_plan = kernels.plan_decode(
                [s.seq.block_table for s in decodes],
                [s.seq.num_computed_tokens + 1 for s in decodes],
                bs,
                dev,
                cascade=self.config.cascade_attention,
                # when a shared prefix pays as a group depends on the decode backend
                thresholds=kernels.cascade_thresholds(self.k_caches[0]),
            )
        if prefills:
            prefill_plan = kernels.plan_prefill(
                [s.seq.block_table for s in prefills],
                [s.num_new_tokens for s in prefills],
                [s.seq.num_computed_tokens + s.num_new_tokens for s in prefills],
                bs,
                dev,
            )
        return StepAttention(
            self.k_caches,
            self.v_caches,
            torch.tensor(slots, dtype=torch.int64, device=dev),
            len(decodes),
            decode_plan,
            prefill_plan,
            self.scale,
        )
