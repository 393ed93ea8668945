"""Who a client is: tokens -> tenants, compared in constant time, and a per-address limit on
failed attempts.

The tenant is the authenticated identity, never what a client declares: KV (and therefore
``cached_tokens``) is shared only within a tenant. Without any token configured every client
is the one tenant ``None`` (local use).
"""

from __future__ import annotations

import hmac
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from eclectus.server.config import ServerConfig

MAX_TRACKED_ADDRESSES = 10_000  # addresses with recent failures kept; the oldest go first


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated client: its tenant (None: authentication is off)."""

    tenant: str | None


class AuthFailure(Exception):
    """A missing or wrong token (``rate_limited``: too many recent failures from this
    address, the token was not even checked)."""

    def __init__(self, message: str, *, rate_limited: bool = False) -> None:
        super().__init__(message)
        self.rate_limited = rate_limited


@dataclass(slots=True)
class FailureLimiter:
    """Recent authentication failures per client address (a sliding window). Mutating
    methods say so; everything runs on the server's event loop."""

    max_failures: int
    window_s: float
    clock: Callable[[], float] = time.monotonic
    failures: OrderedDict[str, deque[float]] = field(default_factory=OrderedDict)

    def blocked(self, address: str) -> bool:
        """Whether ``address`` used up its failures in the window (mutates: forgets old
        failures)."""
        recent = self.failures.get(address)
        if recent is None:
            return False
        horizon = self.clock() - self.window_s
        while recent and recent[0] < horizon:
            recent.popleft()
        if not recent:
            del self.failures[address]
            return False
        return len(recent) >= self.max_failures

    def record(self, address: str) -> None:
        """Count one failure from ``address`` (mutates; bounded memory)."""
        recent = self.failures.pop(address, None) or deque(maxlen=self.max_failures)
        recent.append(self.clock())
        self.failures[address] = recent  # most recent last
        while len(self.failures) > MAX_TRACKED_ADDRESSES:
            self.failures.popitem(last=False)


class Authenticator:
    """Checks tokens for every transport (WebSocket hello, HTTP bearer)."""

    def __init__(self, config: ServerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.credentials = [(tenant, token.encode()) for tenant, token in config.credentials]
        self.limiter = FailureLimiter(config.max_auth_failures, config.auth_window_s, clock)
        self.num_failures = 0  # for /metrics

    @property
    def required(self) -> bool:
        return bool(self.credentials)

    def authenticate(self, token: str | None, address: str) -> Identity:
        """The identity ``token`` proves; AuthFailure when it proves none or ``address`` is
        rate-limited (mutates: counts failures). Every configured token is compared, each in
        constant time, so the time taken says nothing about which one nearly matched."""
        if not self.required:
            return Identity(None)
        if self.limiter.blocked(address):
            raise AuthFailure("too many failed authentications; retry later", rate_limited=True)
        given = (token or "").encode()
        found: str | None = None
        for tenant, expected in self.credentials:
            if hmac.compare_digest(given, expected):
                found = tenant
        if found is None:
            self.num_failures += 1
            self.limiter.record(address)
            raise AuthFailure("missing or wrong token")
        return Identity(found)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer T`` header; the scheme is case-insensitive
    (RFC 7235) (pure)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None
