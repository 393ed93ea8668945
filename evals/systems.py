"""The systems compared: how each is reached and what it runs.

- ``eclectus``: the app through ChatEclectus/EclectusLLM with ``compile`` (the graph path);
- ``self``: the same Eclectus engine behind its OpenAI-compatible endpoint, driven by the stock
  ``langchain_openai`` classes (what the engine alone buys);
- ``vllm`` / ``vllm-nopc``: stock vLLM with prefix caching on / off, stock classes;
- ``eclectus-vllm``: the app's graph through Eclectus (as ``eclectus``), whose scheduler sends
  the calls to a stock vLLM with priority scheduling (``eclectus serve --engine-url``);
- ``NAME/swap`` (``--variants swap``): an Eclectus system with the import swap alone, no
  ``compile``: every call the app makes is its own round trip, as an app people already
  wrote runs once the model class is swapped;
- ``openai``: any OpenAI-compatible server already running, stock classes.

With a round-trip delay, every client connection goes through a :class:`DelayProxy`; the
harness's own reads (/metrics, cache resets, the lower-bound chains) go direct.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from eclectus.evals.proxy import DelayProxy, Traffic
from eclectus.evals.servers import EclectusProcess, EclectusRemoteProcess, ServerProcess
from eclectus.recipes.target import Backend, Target

# how an Eclectus system runs the app: "swap" the import swap alone, every call its own
# round trip; "compiled" its chains and graphs wrapped with compile (both evals)
Variant = Literal["swap", "compiled"]
VARIANTS: tuple[Variant, ...] = ("swap", "compiled")


def parse_choices(text: str, flag: str, choices: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated flag value, each entry one of ``choices``, each once (pure;
    ValueError naming ``flag`` and the choices otherwise)."""
    items = tuple(t.strip() for t in text.split(",") if t.strip())
    if not items or any(t not in choices for t in items) or len(set(items)) != len(items):
        raise ValueError(f"{flag} {text!r}: choose from {', '.join(choices)}, each once")
    return items


@dataclass
class System:
    """One system under test. ``url`` is its real address; ``server`` None for a server
    the harness did not start (``openai=URL``)."""

    name: str
    backend: Backend
    url: str
    model: str
    server: ServerProcess | None
    description: str
    rtt_s: float = 0.0
    handshake: bool = True  # the proxy charges each new connection's TCP handshake
    compiled: bool = True  # Eclectus mode: wrap the app's chains and graphs with compile
    _proxy: DelayProxy | None = field(default=None, repr=False)

    @property
    def engine(self) -> str:
        """The engine this system runs on (systems on one engine share a lower bound)."""
        return self.server.engine_name if self.server is not None else self.name

    def bound_endpoint(self) -> tuple[str, str]:
        """(OpenAI-compatible URL, model id) of this system's engine itself, bypassing any
        proxy and any Eclectus in front of it: where the lower-bound chain runs (pure)."""
        if isinstance(self.server, EclectusRemoteProcess):
            engine = self.server.engines[0]
            return engine.openai_url, engine.served_name
        return (self.server.openai_url if self.server is not None else self.url), self.model

    def client_url(self) -> str:
        """The URL the app connects to: through the delay proxy when there is a delay
        (mutates: starts the proxy on first use)."""
        if self.rtt_s <= 0:
            return self.url
        parts = urlsplit(self.url)
        if self._proxy is None:
            assert parts.hostname is not None and parts.port is not None, self.url
            self._proxy = DelayProxy(
                parts.hostname, parts.port, self.rtt_s, handshake=self.handshake
            )
        netloc = f"127.0.0.1:{self._proxy.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    def traffic(self) -> Traffic | None:
        """What crossed this system's delay proxy so far; None when it has none (pure)."""
        return self._proxy.traffic() if self._proxy is not None else None

    def new_run(self) -> None:
        """Tell the proxy a run starts (mutates; see DelayProxy.new_run); no-op without one."""
        if self._proxy is not None:
            self._proxy.new_run()

    def set_rtt(self, rtt_s: float) -> None:
        """Use client round trip ``rtt_s`` from the next run on (mutates: a changed delay
        stops the old proxy; the next :meth:`client_url` starts one with the new delay)."""
        if rtt_s != self.rtt_s:
            self.close()
            self.rtt_s = rtt_s

    def target(self) -> Target:
        """The recipe Target for this system (starts the proxy when needed)."""
        metrics = self.server.metrics_url if isinstance(self.server, EclectusProcess) else None
        return Target(
            self.backend,
            self.client_url(),
            self.model,
            metrics_url=metrics,
            use_compile=self.compiled,
        )

    def close(self) -> None:
        """Stop this system's proxy (mutates; the server is stopped by its owner)."""
        if self._proxy is not None:
            self._proxy.close()
            self._proxy = None
