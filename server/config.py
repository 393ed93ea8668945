"""ServerConfig: everything the server needs to know, as one frozen, validated object."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How and what to serve, and the limits that keep one client from hurting others.

    ``port`` 0 picks a free port. ``token`` None turns authentication off. ``aging_rate`` is
    the scheduler's starvation guard: a queued call's application rank improves by this many
    seconds per second it has waited (0: strict app-FIFO; 1: plain FIFO by queue time).
    """

    host: str = "127.0.0.1"
    port: int = 8765
    model: str = "tiny"
    # the names clients may ask for (vLLM's --served-model-name); empty: the model's own name
    # (the preset name, or the directory path as given). A call naming another is refused.
    served_model_names: tuple[str, ...] = ()
    token: str | None = None
    max_frame_bytes: int = 1 << 20  # larger frames get a limit_exceeded error frame
    max_prompt_tokens: int = 8192  # one engine request's prompt, variables resolved
    max_vars_per_session: int = 10_000
    max_calls_per_session: int = 4_096  # calls and ops together
    max_sessions: int = 256
    max_inflight: int = 256  # engine requests in flight at once, all sessions together
    aging_rate: float = 0.1
    # throughput-class calls let into the engine while latency/deadline work is in flight:
    # a throughput call dispatched next to an urgent one slows every one of its steps (a
    # bigger batch, prefill chunks), so background work trickles while someone waits
    max_background_inflight: int = 1
    close_timeout_s: float = 5.0
    openai_port: int | None = None  # None: no OpenAI-compatible listener; 0: a free port

    def __post_init__(self) -> None:
        for name in ("port", "openai_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 65535:
                raise ValueError(f"{name} must be in [0, 65535], got {value}")
        for name in (
            "max_frame_bytes",
            "max_prompt_tokens",
            "max_vars_per_session",
            "max_calls_per_session",
            "max_sessions",
            "max_inflight",
            "max_background_inflight",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.aging_rate < 0:
            raise ValueError(f"aging_rate must be >= 0, got {self.aging_rate}")
        if any(not name for name in self.served_model_names):
            raise ValueError("served_model_names must not contain an empty name")
        if self.token == "":
            raise ValueError("token must be non-empty (use None to turn auth off)")

    def check_model(self, name: str | None, field: str) -> None:
        """Raise ServerError ``unknown_model`` unless ``name`` is None (the default model) or
        one of the served names (pure)."""
        if name is not None and name not in self.served_model_names:
            from eclectus.server.errors import ServerError

            served = ", ".join(repr(n) for n in self.served_model_names)
            raise ServerError(
                "unknown_model",
                f"model {name!r} is not served here (served: {served})",
                field=field,
            )

    @property
    def auth_required(self) -> bool:
        return self.token is not None

    @property
    def max_socket_bytes(self) -> int:
        """websockets' max_size: above max_frame_bytes so that a frame a little too large is
        still read and answered with an error frame; beyond this the socket closes (1009)."""
        return 4 * self.max_frame_bytes

    @staticmethod
    def token_from_env() -> str | None:
        """ECLECTUS_TOKEN, or None when unset or empty (pure)."""
        return os.environ.get("ECLECTUS_TOKEN") or None
