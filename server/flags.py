"""``eclectus serve``'s flags: the server's limits and scheduling (:class:`ServerConfig`), the
remote engines (:class:`~eclectus.server.remote.config.RemoteConfig`) and, from
:mod:`.engine_flags`, the built-in engine's budgets; and the ServerConfig they describe."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import get_args

from eclectus.protocol.tool_formats import TOOL_FORMATS
from eclectus.server.config import Admission, ServerConfig, read_token_file
from eclectus.server.engine_flags import add_engine_arguments
from eclectus.server.event_loop import LOOPS
from eclectus.server.flag_types import (
    engine_seqs,
    non_negative_float,
    non_negative_int_or_none,
    positive_float,
    positive_int,
    positive_int_or_none,
)
from eclectus.server.graph.policies import ProgramPolicy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The serve flags (mutates ``parser``)."""
    defaults = ServerConfig()
    parser.add_argument("--host", default=defaults.host, help="address to bind")
    parser.add_argument("--port", type=int, default=defaults.port, help="port (0: any free)")
    parser.add_argument(
        "--model",
        default=defaults.model,
        help="'tiny' or a local Hugging Face checkpoint directory",
    )
    parser.add_argument(
        "--served-model-name",
        dest="served_model_names",
        nargs="+",
        default=[],
        metavar="NAME",
        help="the model names clients may use (default: the --model value, as vLLM does)",
    )
    parser.add_argument(
        "--tool-call-parser",
        choices=TOOL_FORMATS,
        default=defaults.tool_call_parser,
        help="the model's tool-call syntax (default: detected from its chat template)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="require this token (tenant 'default'; default: $ECLECTUS_TOKEN; unset: off)",
    )
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="PATH",
        help="one 'TENANT TOKEN' pair per line; a client's tenant is its token's",
    )
    parser.add_argument(
        "--max-frame-bytes",
        type=int,
        default=defaults.max_frame_bytes,
        help="largest client frame; a larger one gets a limit_exceeded error",
    )
    parser.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=defaults.max_prompt_tokens,
        help="longest prompt of one call, variables filled in",
    )
    parser.add_argument(
        "--max-vars-per-session",
        type=int,
        default=defaults.max_vars_per_session,
        help="semantic variables one session may declare",
    )
    parser.add_argument(
        "--max-calls-per-session",
        type=int,
        default=defaults.max_calls_per_session,
        help="calls and server-side ops one session may declare",
    )
    parser.add_argument(
        "--max-map-items",
        type=positive_int,
        default=defaults.max_map_items,
        help="elements one map op may fan out to",
    )
    parser.add_argument(
        "--max-map-element-bytes",
        type=positive_int,
        default=defaults.max_map_element_bytes,
        help="bytes of one map element",
    )
    parser.add_argument(
        "--max-pending-gets-per-session",
        type=positive_int,
        default=defaults.max_pending_gets_per_session,
        help="gets one session may have waiting on unfinished variables",
    )
    parser.add_argument(
        "--max-outbox-bytes",
        type=positive_int,
        default=defaults.max_outbox_bytes,
        help="frames queued for one slow reader before its session is closed",
    )
    parser.add_argument(
        "--max-sessions", type=int, default=defaults.max_sessions, help="open sessions at once"
    )
    parser.add_argument(
        "--max-sessions-per-tenant",
        type=int,
        default=defaults.max_sessions_per_tenant,
        help="open sessions one tenant may hold",
    )
    parser.add_argument(
        "--max-connections",
        type=positive_int,
        default=defaults.max_connections,
        help="open TCP connections, all clients together (beyond: HTTP 429, retried by the SDK)",
    )
    parser.add_argument(
        "--max-connections-per-client",
        type=positive_int_or_none,
        default=defaults.max_connections_per_client,
        metavar="N|none",
        help="open TCP connections one client address may hold (default none: a front behind "
        "a load balancer or serving one app server sees one address)",
    )
    parser.add_argument(
        "--max-prompts-per-request",
        type=int,
        default=defaults.max_prompts_per_request,
        help="prompts in one /v1/completions request",
    )
    parser.add_argument(
        "--handshake-timeout",
        dest="handshake_timeout_s",
        type=positive_float,
        default=defaults.handshake_timeout_s,
        help="seconds for an HTTP request head, or for hello after the upgrade",
    )
    parser.add_argument(
        "--idle-timeout",
        dest="idle_timeout_s",
        type=positive_float,
        default=defaults.idle_timeout_s,
        help="seconds before a session with nothing in flight is closed",
    )
    parser.add_argument(
        "--shutdown-timeout",
        dest="shutdown_timeout_s",
        type=non_negative_float,
        default=defaults.shutdown_timeout_s,
        help="seconds in-flight work may take to finish after SIGTERM",
    )
    parser.add_argument(
        "--max-inflight",
        type=int,
        default=defaults.max_inflight,
        help="engine requests in flight at once, all sessions together",
    )
    parser.add_argument(
        "--max-inflight-per-tenant",
        type=positive_int_or_none,
        default=defaults.max_inflight_per_tenant,
        metavar="N|none",
        help="a tenant's fair share of --max-inflight while another tenant's calls wait "
        "(work-conserving: unused slots still go to anyone); none (default): app-FIFO only",
    )
    parser.add_argument(
        "--max-background-inflight",
        type=int,
        default=defaults.max_background_inflight,
        help="throughput requests in flight while latency work is in flight",
    )
    parser.add_argument(
        "--aging-rate",
        type=non_negative_float,
        default=defaults.aging_rate,
        help="app-FIFO aging: seconds of rank credit per second waited",
    )
    parser.add_argument(
        "--program-policy",
        choices=[p.value for p in ProgramPolicy],
        default=defaults.program_policy,
        help="the order of programs within a class: fifo (app-FIFO with aging), las (least "
        "attained service: Autellix's PLAS/ATLAS, in tokens computed), fair (app-FIFO with "
        "attained service as a delay: fair queueing of programs), deadline (earliest "
        "deadline first; docs/architecture.md)",
    )
    parser.add_argument(
        "--las-tokens-per-s",
        type=positive_float,
        default=defaults.las_tokens_per_s,
        help="las, fair: tokens of attained service that rank like one second of arrival",
    )
    parser.add_argument(
        "--latency-deadline",
        dest="latency_deadline_s",
        type=positive_float,
        default=defaults.latency_deadline_s,
        help="deadline policy: seconds after its graph's arrival a latency get is due",
    )
    parser.add_argument(
        "--program-gap",
        dest="program_gap_s",
        type=non_negative_float,
        default=defaults.program_gap_s,
        help="a session's call within this many seconds of its last activity continues its "
        "program (an eager agent's next turn): fifo/fair/deadline rank it by the program's "
        "arrival; after a longer pause a new program starts, its attained service from none",
    )
    parser.add_argument(
        "--admission",
        choices=get_args(Admission),
        default=defaults.admission,
        help="engine: requests go to the engine only while its batch and KV cache have room, "
        "the rest wait in the scheduler's order; off: up to --max-inflight go",
    )
    parser.add_argument(
        "--max-engine-seqs",
        type=engine_seqs,
        default=defaults.max_engine_seqs,
        metavar="N|none|auto",
        help="requests admitted to one engine at once; none (default): the engine's own "
        "batch (--max-num-seqs; remote: --engine-max-inflight); auto: the batch at the "
        "engine's throughput knee, learned from its decode steps",
    )
    parser.add_argument(
        "--kv-admit-fraction",
        type=positive_float,
        default=defaults.kv_admit_fraction,
        help="KV cache the admitted requests may reserve (prompt + max_tokens each)",
    )
    parser.add_argument(
        "--openai-port",
        type=int,
        default=None,
        help="deprecated and ignored: /v1 is served on --port",
    )
    parser.add_argument(
        "--api-server-count",
        type=positive_int,
        default=1,
        metavar="N",
        help="front processes serving the one port (vLLM's flag); N > 1 needs --engine-url "
        "and no --engine builtin (docs/engines.md, 'Several front processes')",
    )
    parser.add_argument(
        "--dev-endpoints",
        action="store_true",
        help="serve POST /reset_prefix_cache (vLLM's dev-mode endpoint): empties the "
        "engine's prefix cache between benchmark runs",
    )
    parser.add_argument(
        "--loop",
        choices=LOOPS,
        default="auto",
        help="the event loop (uvicorn's flag): uvloop, as vLLM's API server runs, or asyncio's "
        "own; auto: uvloop when installed",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        type=str.upper,
        help="server log verbosity (stderr)",
    )
    add_remote_arguments(parser)
    add_engine_arguments(parser)


def add_remote_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that put engines other processes serve behind the scheduler (vLLM, SGLang,
    another Eclectus; docs/engines.md) (mutates ``parser``)."""
    from eclectus.server.remote.config import RemoteConfig
    from eclectus.server.remote.routing import RoutingPolicy

    defaults = {f.name: f.default for f in fields(RemoteConfig)}
    remote = parser.add_argument_group("remote engines (docs/engines.md)")
    remote.add_argument(
        "--engine-url",
        dest="engine_urls",
        action="append",
        default=[],
        metavar="URL",
        help="an OpenAI-compatible engine to schedule for (vLLM, SGLang: http://host:port/v1); "
        "repeat for a fleet. --model then only gives the tokenizer and chat template",
    )
    remote.add_argument(
        "--engine",
        choices=["builtin"],
        default=None,
        help="with --engine-url: also run the built-in engine as one member of the pool "
        "(without --engine-url the built-in engine always serves)",
    )
    remote.add_argument(
        "--engine-kv-events",
        dest="engine_kv_events",
        action="append",
        default=[],
        metavar="PUB[,REPLAY]|none",
        help="where the engine of the --engine-url in the same position publishes its KV "
        "cache events (vLLM --kv-events-config; e.g. tcp://gpu0:5557,tcp://gpu0:5558): "
        "routing then reads what its cache holds; 'none' for an engine without",
    )
    remote.add_argument(
        "--routing",
        choices=[p.value for p in RoutingPolicy],
        default=defaults["routing"].value,
        help="how calls are spread over the engines (graph: prefix- and group-aware)",
    )
    remote.add_argument(
        "--engine-max-inflight",
        type=positive_int,
        default=defaults["max_inflight_per_engine"],
        help="our requests on one engine at once",
    )
    remote.add_argument(
        "--engine-max-background",
        type=non_negative_int_or_none,
        default=defaults["max_background_per_engine"],
        help="background (throughput) calls one engine runs while latency calls are in "
        "flight on it; the others are paused and continued later (none: no cap)",
    )
    remote.add_argument(
        "--engine-stream-interval",
        type=positive_int,
        default=ServerConfig().engine_stream_interval,
        help="tokens an engine may batch into one streamed output of a call nobody watches "
        "token by token (vLLM's stream_interval); 1: every token, as watched calls get",
    )
    remote.add_argument(
        "--engine-api-key",
        default=None,
        help="bearer token for the engines (vLLM --api-key; default: $ECLECTUS_ENGINE_API_KEY)",
    )
    remote.add_argument(
        "--engine-timeout",
        type=positive_float,
        default=defaults["read_timeout_s"],
        help="seconds to wait for an engine's next streamed piece before failing over",
    )
    remote.add_argument(
        "--engine-probe-interval",
        type=positive_float,
        default=defaults["probe_interval_s"],
        help="seconds between re-probes of a down engine (and /metrics scrapes)",
    )
    remote.add_argument(
        "--engine-down-wait",
        type=non_negative_float,
        default=defaults["max_down_wait_s"],
        help="seconds a call that finds no engine healthy waits for one to come back "
        "before failing with engine_unavailable (0: fail at once)",
    )


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The ServerConfig the flags describe: each flag whose dest names a field (pure apart
    from reading ECLECTUS_TOKEN)."""
    given = {f.name: getattr(args, f.name) for f in fields(ServerConfig) if hasattr(args, f.name)}
    given["token"] = args.token or ServerConfig.token_from_env()
    given["served_model_names"] = tuple(args.served_model_names)
    token_file = getattr(args, "token_file", None)
    if token_file is not None:
        given["tenant_tokens"] = read_token_file(token_file)
    return ServerConfig(**given)
