"""Attention kernels for paged KV caches and shared prefixes (Parrot-style cascade).

The engine calls only the dispatching functions below; each runs a Triton kernel on CUDA and a
vectorised torch path elsewhere (see ``dispatch``). Build a plan once per engine step
(:func:`plan_prefill`, :func:`plan_decode`) and pass it to every layer. LSE values are natural
log throughout. Importing this package never needs triton.
"""

from eclectus.kernels.dispatch import (
    HAS_TRITON,
    cascade_decode_attention,
    cascade_thresholds,
    decode_attention,
    merge_attention_states,
    paged_decode_attention,
    prefill_attention,
    row_prefill_pays,
    store_kv,
    use_triton,
)
from eclectus.kernels.plans import (
    CASCADE_MIN_GROUP_SIZE,
    CASCADE_MIN_SHARED_TOKENS,
    CascadeGroup,
    CascadePlan,
    CascadeTables,
    DecodePlan,
    PrefillPlan,
    build_decode_plan,
    cascade_tables,
    find_cascade_groups,
    plan_decode,
    plan_prefill,
)
from eclectus.kernels.reference import (
    ref_attention,
    ref_merge_attention_states,
    ref_paged_decode,
    ref_prefill,
)
from eclectus.kernels.table_cache import BlockTableCache

__all__ = [
    "CASCADE_MIN_GROUP_SIZE",
    "CASCADE_MIN_SHARED_TOKENS",
    "HAS_TRITON",
    "BlockTableCache",
    "CascadeGroup",
    "CascadePlan",
    "CascadeTables",
    "DecodePlan",
    "PrefillPlan",
    "build_decode_plan",
    "cascade_decode_attention",
    "cascade_tables",
    "cascade_thresholds",
    "decode_attention",
    "find_cascade_groups",
    "merge_attention_states",
    "paged_decode_attention",
    "plan_decode",
    "plan_prefill",
    "prefill_attention",
    "ref_attention",
    "ref_merge_attention_states",
    "ref_paged_decode",
    "ref_prefill",
    "row_prefill_pays",
    "store_kv",
    "use_triton",
]
