"""ServerConfig: everything the server needs to know, as one frozen, validated object."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, get_args

from eclectus.protocol.tool_formats import ToolFormatName
from eclectus.server.checks import require_range
from eclectus.server.graph.policies import PolicyParams, ProgramPolicy

Admission = Literal["engine", "off"]
_POLICY = PolicyParams()  # the program policy's defaults (policies.py owns them)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How and what to serve, and the limits that keep one client from hurting others.

    ``port`` 0 picks a free port. Authentication: ``token`` is the token of the single tenant
    ``default``; ``tenant_tokens`` holds (tenant, token) pairs (``--token-file``). With
    neither, authentication is off and every client is the one tenant ``None`` (local use).
    ``aging_rate`` is the scheduler's starvation guard: a queued call's application rank
    improves by this many seconds per second it has waited (0: strict app-FIFO; 1: plain
    FIFO by queue time).
    ``program_policy`` orders programs within a class (policies.py): ``fifo`` (app-FIFO
    with aging), ``las`` (least attained service, with ``las_tokens_per_s``), ``fair``
    (app-FIFO's arrival delayed by the attained service over ``las_tokens_per_s``) or
    ``deadline`` (earliest deadline first, a latency get's deadline its graph's arrival plus
    ``latency_deadline_s``).
    ``admission`` ``engine``: requests go to the engine only while it has room for them
    (admission.py: its batch, at most ``max_engine_seqs`` per engine, and its KV cache up to
    ``kv_admit_fraction``); the rest wait in the scheduler's queue, in its order. ``off``:
    up to ``max_inflight`` go, and queue in the engine.
    """

    host: str = "127.0.0.1"
    port: int = 8765
    model: str = "tiny"
    # the names clients may ask for (vLLM's --served-model-name); empty: the model's own name
    # (the preset name, or the directory path as given). A call naming another is refused.
    served_model_names: tuple[str, ...] = ()
    # the tool-call syntax of the served model (vLLM's --tool-call-parser): "hermes",
    # "llama3_json" or "mistral"; None: detected from the model's chat template
    tool_call_parser: ToolFormatName | None = None
    token: str | None = None
    tenant_tokens: tuple[tuple[str, str], ...] = ()
    max_frame_bytes: int = 1 << 20  # larger frames get a limit_exceeded error frame
    max_prompt_tokens: int = 8192  # one engine request's prompt, variables resolved
    max_vars_per_session: int = 10_000
    max_calls_per_session: int = 4_096  # calls and ops together
    max_map_items: int = 1_024  # one map's fan-out (elements of its JSON array)
    max_map_element_bytes: int = 65_536  # one element's text, UTF-8
    max_pending_gets_per_session: int = 1_024  # gets waiting on unfinished variables
    # frames queued for one client and not yet written; a client reading slower than its
    # answers arrive is disconnected (close 1008) rather than held in server memory
    max_outbox_bytes: int = 16 << 20
    # caps by load and by tenant, not by address: a front behind a load balancer, or serving
    # one app server, sees every program come from one address
    max_sessions: int = 1024
    # so that one tenant cannot take every session slot (with authentication on: without it
    # every client is the one tenant None and max_sessions alone applies)
    max_sessions_per_tenant: int = 512
    max_connections: int = 4096  # open TCP connections, all clients together
    max_connections_per_client: int | None = None  # per client address; None: no such cap
    max_prompts_per_request: int = 64  # prompts in one /v1/completions request
    max_inflight: int = 256  # engine requests in flight at once, all sessions together
    # a tenant's fair share of those while another tenant's calls wait; None: app-FIFO only
    max_inflight_per_tenant: int | None = None
    aging_rate: float = _POLICY.aging_rate
    program_policy: str = _POLICY.policy.value  # a ProgramPolicy value
    las_tokens_per_s: float = _POLICY.las_tokens_per_s
    latency_deadline_s: float = _POLICY.latency_deadline_s
    program_gap_s: float = _POLICY.program_gap_s
    admission: Admission = "engine"
    # requests admitted to one engine at once; None: the engine's own batch (the built-in
    # engine's max_num_seqs, a remote pool's --engine-max-inflight per engine); "auto": the
    # batch at the engine's throughput knee, learned from its decode steps (batch_knee.py)
    max_engine_seqs: int | Literal["auto"] | None = None
    kv_admit_fraction: float = 0.95
    # throughput-class calls let into the engine while latency/deadline work is in flight:
    # a throughput call dispatched next to an urgent one slows every one of its steps (a
    # bigger batch, prefill chunks), so background work trickles while someone waits
    max_background_inflight: int = 1
    # tokens a remote engine may batch into one streamed output of a call nobody watches
    # token by token (no streaming get, a non-streamed /v1 request): vLLM's per-request
    # ``stream_interval``, which spares its API server and this server a detokenize, a JSON
    # chunk and its parse per token; watched calls stream every token (1: always)
    engine_stream_interval: int = 16
    close_timeout_s: float = 5.0
    handshake_timeout_s: float = 10.0  # an HTTP request head, or hello after the upgrade
    idle_timeout_s: float = 600.0  # a session with nothing in flight and no frame is closed
    max_auth_failures: int = 10  # per client address per auth_window_s, then refused
    auth_window_s: float = 60.0
    shutdown_timeout_s: float = 30.0  # SIGTERM: in-flight work may finish within this
    # serve POST /reset_prefix_cache (vLLM's endpoint of its VLLM_SERVER_DEV_MODE): for
    # benchmarks that must not serve one run from another's cache; off, as anyone who may
    # call /v1 could flush every tenant's cache with it
    dev_endpoints: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        for name in (
            "max_frame_bytes",
            "max_prompt_tokens",
            "max_vars_per_session",
            "max_calls_per_session",
            "max_map_items",
            "max_map_element_bytes",
            "max_pending_gets_per_session",
            "max_outbox_bytes",
            "max_sessions",
            "max_sessions_per_tenant",
            "max_connections",
            "max_prompts_per_request",
            "max_inflight",
            "max_background_inflight",
            "engine_stream_interval",
            "max_auth_failures",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("close_timeout_s", "handshake_timeout_s", "idle_timeout_s", "auth_window_s"):
            require_range(name, getattr(self, name), 0, inclusive=False)
        require_range("shutdown_timeout_s", self.shutdown_timeout_s, 0, inclusive=True)
        if self.max_connections_per_client is not None and self.max_connections_per_client < 1:
            raise ValueError(
                f"max_connections_per_client must be >= 1, got {self.max_connections_per_client}"
            )
        if self.max_inflight_per_tenant is not None and self.max_inflight_per_tenant < 1:
            raise ValueError(
                f"max_inflight_per_tenant must be >= 1, got {self.max_inflight_per_tenant}"
            )
        self._check_scheduling()
        if any(not name for name in self.served_model_names):
            raise ValueError("served_model_names must not contain an empty name")
        if self.tool_call_parser is not None:
            from eclectus.protocol.tool_formats import tool_format

            tool_format(self.tool_call_parser)  # ValueError naming the choices
        if self.token == "":
            raise ValueError("token must be non-empty (use None to turn auth off)")
        self._check_tenant_tokens()

    def _check_scheduling(self) -> None:
        _ = self.policy_params  # PolicyParams checks its knobs (ValueError naming one)
        if self.admission not in get_args(Admission):
            modes = " or ".join(repr(m) for m in get_args(Admission))
            raise ValueError(f"admission must be {modes}, got {self.admission!r}")
        seqs = self.max_engine_seqs
        if seqs is not None and seqs != "auto" and (not isinstance(seqs, int) or seqs < 1):
            raise ValueError(f"max_engine_seqs must be >= 1, 'auto' or None, got {seqs!r}")
        if not 0 < self.kv_admit_fraction <= 1:  # NaN is not
            raise ValueError(f"kv_admit_fraction must be in (0, 1], got {self.kv_admit_fraction}")

    @property
    def policy_params(self) -> PolicyParams:
        """The program-level policy and its knobs (pure)."""
        return PolicyParams(
            ProgramPolicy(self.program_policy),
            self.aging_rate,
            self.las_tokens_per_s,
            self.latency_deadline_s,
            self.program_gap_s,
        )

    def _check_tenant_tokens(self) -> None:
        tenants: set[str] = set()
        tokens: set[str] = set()
        for tenant, token in self.credentials:
            if not tenant or not token:
                raise ValueError("a tenant and its token must both be non-empty")
            if tenant in tenants:
                raise ValueError(f"tenant {tenant!r} has more than one token")
            if token in tokens:
                raise ValueError(f"tenant {tenant!r} shares its token with another tenant")
            tenants.add(tenant)
            tokens.add(token)

    @property
    def credentials(self) -> tuple[tuple[str, str], ...]:
        """Every (tenant, token) pair: ``token`` as tenant ``default``, then the token file's
        (pure)."""
        single = (("default", self.token),) if self.token is not None else ()
        return single + self.tenant_tokens

    def serves(self, name: str | None) -> bool:
        """Whether a request may name ``name``: None (the default model) or one of the
        served names (pure). The one rule behind both APIs' unknown-model errors."""
        return name is None or name in self.served_model_names

    def check_model(self, name: str | None, field: str) -> None:
        """Raise ServerError ``unknown_model`` unless :meth:`serves` ``name`` (pure)."""
        if not self.serves(name):
            from eclectus.server.errors import ServerError

            served = ", ".join(repr(n) for n in self.served_model_names)
            raise ServerError(
                "unknown_model",
                f"model {name!r} is not served here (served: {served})",
                field=field,
            )

    @property
    def auth_required(self) -> bool:
        return bool(self.credentials)

    @property
    def max_socket_bytes(self) -> int:
        """The WebSocket message limit: above max_frame_bytes so that a frame a little too
        large is still read and answered with an error frame; beyond this the socket closes
        (1009)."""
        return 4 * self.max_frame_bytes

    @property
    def max_body_bytes(self) -> int:
        """The largest HTTP request body (/v1): a frame's worth of JSON."""
        return self.max_frame_bytes

    @staticmethod
    def token_from_env() -> str | None:
        """ECLECTUS_TOKEN, or None when unset or empty (pure)."""
        return os.environ.get("ECLECTUS_TOKEN") or None


def read_token_file(path: str) -> tuple[tuple[str, str], ...]:
    """(tenant, token) pairs from a file of ``TENANT TOKEN`` lines; blank lines and ``#``
    comments are skipped (reads the file). ValueError naming the line when one is malformed."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise ValueError(f"token file {path}: {exc.strerror or exc}") from None
    pairs: list[tuple[str, str]] = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = text.split()
        if len(parts) != 2:
            raise ValueError(f"token file {path}, line {number}: expected 'TENANT TOKEN'")
        pairs.append((parts[0], parts[1]))
    if not pairs:
        raise ValueError(f"token file {path} holds no 'TENANT TOKEN' line")
    return tuple(pairs)
