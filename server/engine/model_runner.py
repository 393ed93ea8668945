"""Runs one scheduled step through the model over the paged KV cache.

Per step: one flat batch of tokens (decodes first, then
prefill chunks) built from lists once, the attention plans built once, and one forward whose
every layer stores its K/V and attends through ``eclectus.kernels``. Only the rows that sample
get logits.

Short prefill chunks over a cached context (a request's own tokens after a prefix-cache hit,
the tail of a chunked prompt) may attend as decode rows: query j of a chunk that starts at
position s is exactly a decode at position s + j over the same block table. When such rows
share their context with other rows (one prefix behind many requests' suffixes, or the decodes
of the step), the decode plan's cascade groups them, and the shared blocks are read once for
all of them (the native prefix pass) instead of being gathered per request for a masked SDPA.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from dataclasses import dataclass

import torch
from torch import Tensor

from eclectus import kernels
from eclectus.server.engine.engine_config import DTYPE_BYTES, EngineConfig
from eclectus.server.engine.model import LlamaForCausalLM
from eclectus.server.engine.model_config import ModelConfig
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


MADV_HUGEPAGE = 14  # Linux <sys/mman.h>
HUGE_PAGE = 2 << 20


def kv_pool(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """A zeroed KV pool. On a Linux CPU its memory is advised into 2 MiB pages before it is
    touched: a decode step reads each request's blocks from wherever the allocator put them,
    and with 4 KiB pages every block of every head is a TLB miss of its own (scattered blocks,
    4 layers of 32 x 560 tokens: 9.1 ms against 11.1 ms per step; docs/benchmarks.md). Where
    the advice is refused (another OS, THP off) the pool is the same, in small pages."""
    if device.type != "cpu" or sys.platform != "linux":
        return torch.zeros(shape, dtype=dtype, device=device)
    pool = torch.empty(shape, dtype=dtype, device=device)
    start = pool.data_ptr()
    first = -(-start // HUGE_PAGE) * HUGE_PAGE
    last = (start + pool.numel() * pool.element_size()) // HUGE_PAGE * HUGE_PAGE
    if last > first:
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), MADV_HUGEPAGE)
    return pool.zero_()


# a prefill chunk of at most this many tokens after a cached context may attend as decode rows
# (longer chunks are mostly their own causal square, which SDPA computes as one GEMM)
MAX_ROW_PREFILL_TOKENS = 128


@dataclass(slots=True)
class StepAttention:
    """The AttentionFn of one step: plans built once, used by every layer.

    Rows [0, num_decodes) of q are decode rows (one query each: a decode, or one token of a
    short prefill chunk attending as a decode), the rest prefill chunks.
    Calling it MUTATES the caches (stores this step's K/V before attending).
    """

    k_caches: Tensor  # [layers, num_blocks, Hkv, block_size, D]: head-major blocks
    v_caches: Tensor
    slot_mapping: Tensor  # int64 [T]
    num_decodes: int
    decode_plan: kernels.DecodePlan | None
    prefill_plan: kernels.PrefillPlan | None
    scale: float
    # the last layer's queries when the forward computes only the rows that sample (fewer than
    # the step's tokens): each is its sequence's last token so far, i.e. a decode row over the
    # block table (None: no sampled row, or every row samples)
    rows_plan: kernels.DecodePlan | None = None

    def __call__(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        k_cache, v_cache = self.k_caches[layer_idx], self.v_caches[layer_idx]
        kernels.store_kv(k, v, k_cache, v_cache, self.slot_mapping)
        if q.shape[0] != k.shape[0]:  # the last layer, for the sampled rows only
            if self.rows_plan is None:
                return torch.empty_like(q)  # no row samples: q is empty
            return kernels.decode_attention(q, k_cache, v_cache, self.rows_plan, self.scale)
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
        self.k_caches = kv_pool(shape, model.dtype, self.device)
        self.v_caches = kv_pool(shape, model.dtype, self.device)
        self.scale = model_config.head_dim**-0.5
        # prefill chunks up to this long after a cached context may attend as decode rows
        # (0: never; the benchmarks' A/B sets it)
        self.max_row_prefill_tokens = MAX_ROW_PREFILL_TOKENS
        self.num_row_prefill_tokens = 0  # prefill tokens that attended as decode rows, ever
        # the decode steps' block-table tensor, patched from step to step (None: rebuilt from
        # the lists every step; the benchmarks' A/B sets it)
        self.table_cache: kernels.BlockTableCache | None = kernels.BlockTableCache()
        # a step whose rows do not all sample computes the last layer's attention output and
        # MLP for the sampled rows only (False: for every row; the benchmarks' A/B sets it)
        self.sampled_rows_only = True

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> tuple[list[ScheduledSeq], Tensor]:
        """Run the step. Returns the items that sample, in ``out.scheduled`` order, and their
        logits [num_sampling, vocab] fp32. Mutates the KV cache."""
        decodes = [s for s in out.scheduled if s.num_new_tokens == 1]
        prefills = [s for s in out.scheduled if s.num_new_tokens > 1]
        rows = [s for s in prefills if self._row_prefill(s)]  # may attend as decode rows
        prefills = rows + [s for s in prefills if not self._row_prefill(s)]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_row: dict[int, int] = {}  # id(item) -> row of its last token
        bs = self.block_size
        for item in decodes:  # one token each: its slot without building the block's range
            seq, pos = item.seq, item.seq.num_computed_tokens
            input_ids.append(seq.token_ids[pos])
            positions.append(pos)
            slots.append(seq.block_table[pos // bs] * bs + pos % bs)
            if item.samples:
                sample_row[id(item)] = len(input_ids) - 1
        for item in prefills:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_new_tokens
            input_ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += _slots(seq.block_table, start, end, bs)
            if item.samples:
                sample_row[id(item)] = len(input_ids) - 1
        attn = self._attention(decodes, rows, prefills, slots)
        dev = self.device
        sampling = [item for item in out.scheduled if item.samples]
        sample_rows = [sample_row[id(item)] for item in sampling]
        only = None  # every row samples (a decode-only step): the last layer for all of them
        if self.sampled_rows_only and len(sample_rows) < len(input_ids):
            # the last layer computes only the sampled rows (LlamaForCausalLM.forward); each
            # attends as a decode row over its sequence's context, its own K/V included
            only = torch.tensor(sample_rows, device=dev, dtype=torch.int64)
            if sampling:
                attn.rows_plan = self._decode_plan(
                    [item.seq.block_table for item in sampling],
                    [item.seq.num_computed_tokens + item.num_new_tokens for item in sampling],
                    reuse=False,  # the decode steps' table cache keeps their rows
                )
        hidden = self.model(
            torch.tensor(input_ids, device=dev), torch.tensor(positions, device=dev), attn, only
        )
        if only is None and sample_rows != list(range(len(input_ids))):
            hidden = hidden[torch.tensor(sample_rows, device=dev, dtype=torch.int64)]
        # else hidden holds the sampled rows, in order: no gather
        return sampling, self.model.compute_logits(hidden)

    def _attention(
        self,
        decodes: list[ScheduledSeq],
        rows: list[ScheduledSeq],
        prefills: list[ScheduledSeq],
        slots: list[int],
    ) -> StepAttention:
        """The step's plans. ``rows`` (the head of ``prefills``) attend as decode rows when
        that makes a cascade group form; else every prefill runs as a chunk. Mutates only
        ``num_row_prefill_tokens``."""
        bs, dev = self.block_size, self.device
        decode_plan = prefill_plan = None
        num_decodes = len(decodes)
        tables = [s.seq.block_table for s in decodes]
        seq_lens = [s.seq.num_computed_tokens + 1 for s in decodes]
        if rows and self.config.cascade_attention and kernels.row_prefill_pays(self.k_caches[0]):
            row_tables, row_lens = list(tables), list(seq_lens)
            for s in rows:
                start = s.seq.num_computed_tokens
                row_tables += [s.seq.block_table] * s.num_new_tokens
                row_lens += range(start + 1, start + s.num_new_tokens + 1)
            plan = self._decode_plan(row_tables, row_lens, reuse=False)  # rows repeat tables
            if plan.cascade is not None:  # the rows share context: attend as decodes
                decode_plan, num_decodes = plan, len(row_lens)
                self.num_row_prefill_tokens += len(row_lens) - len(decodes)
                prefills = prefills[len(rows) :]
        if decode_plan is None and decodes:
            decode_plan = self._decode_plan(tables, seq_lens)
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
            num_decodes,
            decode_plan,
            prefill_plan,
            self.scale,
        )

    def _decode_plan(
        self, block_tables: list[list[int]], seq_lens: list[int], *, reuse: bool = True
    ) -> kernels.DecodePlan:
        """The step's decode plan; ``reuse``: its table tensor from :attr:`table_cache`
        (mutates the cache)."""
        return kernels.plan_decode(
            block_tables,
            seq_lens,
            self.block_size,
            self.device,
            cascade=self.config.cascade_attention,
            # when a shared prefix pays as a group depends on the decode backend
            thresholds=kernels.cascade_thresholds(self.k_caches[0]),
            table_cache=self.table_cache if reuse else None,
        )

    def _row_prefill(self, item: ScheduledSeq) -> bool:
        """Whether a prefill chunk may attend as decode rows: short, after a cached context
        (a chunk from position 0 is a plain causal square) (pure)."""
        return item.seq.num_computed_tokens > 0 and item.num_new_tokens <= (
            self.max_row_prefill_tokens
        )
