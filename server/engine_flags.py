"""The built-in engine's ``eclectus serve`` flags, one per :class:`EngineConfig` field and
under vLLM's names where vLLM has one (``--block-size``, ``--max-num-batched-tokens``,
``--max-num-seqs``, ``--max-model-len``, ``--dtype``, ``--enable-prefix-caching``,
``--seed``), and the EngineConfig they describe."""

from __future__ import annotations

import argparse
from dataclasses import fields

from eclectus.server.engine.engine_config import (
    JSON_WHITESPACE,
    SUPPORTED_DTYPES,
    EngineConfig,
    GiB,
)
from eclectus.server.flag_types import (
    non_negative_int,
    positive_gib,
    positive_int,
    positive_int_or_none,
)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The built-in engine's flags, one per EngineConfig field but ``model`` (shared with the
    server) and ``kv_cache_bytes`` (given in GiB) (mutates ``parser``)."""
    defaults = EngineConfig()
    engine = parser.add_argument_group("engine budgets (the built-in engine's EngineConfig)")
    engine.add_argument(
        "--dtype",
        choices=SUPPORTED_DTYPES,
        default=defaults.dtype,
        help="model and KV cache dtype",
    )
    engine.add_argument("--device", default=defaults.device, help="torch device (cpu, cuda, ...)")
    engine.add_argument(
        "--block-size", type=positive_int, default=defaults.block_size, help="tokens per KV block"
    )
    engine.add_argument(
        "--kv-cache-gib",
        type=positive_gib,
        default=defaults.kv_cache_bytes / GiB,
        help="KV pool, all layers, K and V, in GiB (vLLM on CPU: VLLM_CPU_KVCACHE_SPACE)",
    )
    engine.add_argument(
        "--num-kv-blocks",
        type=positive_int,
        default=None,
        help="exact KV pool size in blocks; overrides --kv-cache-gib "
        "(vLLM: --num-gpu-blocks-override)",
    )
    engine.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=defaults.max_num_batched_tokens,
        help="tokens per engine step, prefill chunks and decodes together",
    )
    engine.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=defaults.max_num_seqs,
        help="most requests in one engine step",
    )
    engine.add_argument(
        "--max-background-seqs",
        type=positive_int_or_none,
        default=defaults.max_background_seqs,
        help="most throughput requests in one step while a latency-critical request is in "
        "the engine ('none': no limit)",
    )
    engine.add_argument(
        "--max-model-len",
        type=positive_int,
        default=defaults.max_model_len,
        help="context window cap (default: the model's own)",
    )
    engine.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=defaults.enable_prefix_caching,
        help="reuse the KV of full blocks a prompt shares with an earlier one",
    )
    engine.add_argument(
        "--cascade-attention",
        action=argparse.BooleanOptionalAction,
        default=defaults.cascade_attention,
        help="shared-prefix decode attention when it pays",
    )
    engine.add_argument(
        "--jump-forward",
        action=argparse.BooleanOptionalAction,
        default=defaults.jump_forward,
        help="structured outputs: append a grammar's forced continuation without sampling "
        "(fewer steps; changes greedy outputs: they are no longer stock vLLM's)",
    )
    engine.add_argument(
        "--budget-guarantee",
        action=argparse.BooleanOptionalAction,
        default=defaults.budget_guarantee,
        help="structured outputs: close the structure within max_tokens (changes replies "
        "near max_tokens: they are no longer stock vLLM's)",
    )
    engine.add_argument(
        "--json-whitespace",
        choices=JSON_WHITESPACE,
        default=defaults.json_whitespace,
        help="structured outputs: whitespace between JSON tokens: 'bounded' (what JSON "
        "printers write, at most one line break per place), 'any' (stock vLLM's default) or "
        "'compact' (separators only)",
    )
    engine.add_argument(
        "--compact-json",
        action="store_const",
        const="compact",
        dest="json_whitespace",
        help="--json-whitespace compact: no free whitespace between JSON tokens, for every "
        "request (vLLM's --structured-outputs-config disable_any_whitespace)",
    )
    engine.add_argument(
        "--num-threads",
        type=positive_int,
        default=defaults.num_threads,
        help="torch CPU threads (default: all cores but one)",
    )
    engine.add_argument(
        "--seed",
        type=non_negative_int,
        default=defaults.seed,
        help="the generator of unseeded sampled requests",
    )
    engine.add_argument(
        "--kv-events-config",
        default=None,
        metavar="JSON",
        help="publish the prefix cache's changes as vLLM's KV events, with vLLM's flag and "
        'JSON (e.g. \'{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", '
        '"replay_endpoint": "tcp://*:5558"}\'), for a front routing by them',
    )
    engine.add_argument(
        "--engine-process",
        choices=("on", "off"),
        default="on",
        help="on: step the engine in its own process (vLLM's EngineCore split; the torch "
        "threads are that process's); off: on a thread of the server's process",
    )


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the flags describe: each flag whose dest names a field, and
    ``--kv-cache-gib`` as ``kv_cache_bytes`` (pure; ValueError from EngineConfig's checks)."""
    given = {f.name: getattr(args, f.name) for f in fields(EngineConfig) if hasattr(args, f.name)}
    given["kv_cache_bytes"] = round(args.kv_cache_gib * GiB)
    text = getattr(args, "kv_events_config", None)
    if text is not None:
        from eclectus.protocol.kv_events import KVEventsConfig

        given["kv_events"] = KVEventsConfig.from_json(text)
    return EngineConfig(**given)
