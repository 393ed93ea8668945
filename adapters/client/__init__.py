"""The Eclectus Python SDK: semantic functions and SemanticVariable futures.

::

    from eclectus.adapters.client import connect

    async with connect("ws://127.0.0.1:8765") as app:
        summarize = app.function("Summarize:\\n{{doc}}\\nSummary:{{summary}}",
                                 summary=dict(max_tokens=48))
        s1, s2 = summarize(doc=text1), summarize(doc=text2)  # futures, nothing sent yet
        print(await app.aget_many([s1, s2]))                 # one submit frame for all

Imports no torch: a client-only install needs pydantic and websockets. See docs/sdk.md.
"""

from eclectus.adapters.client.connect import DEFAULT_TIMEOUT, DEFAULT_URL, Connecting, connect
from eclectus.adapters.client.errors import (
    AuthError,
    ConnectionError,
    ConnectionLost,
    EclectusClientError,
    ServerError,
    SessionRefused,
    VariableFailed,
)
from eclectus.adapters.client.functions import Gen, SamplingArgs, SemanticFunction
from eclectus.adapters.client.map_steps import MapSteps
from eclectus.adapters.client.session import Session
from eclectus.adapters.client.sync import SyncSession, connect_sync
from eclectus.adapters.client.variables import SemanticVariable, VarState
from eclectus.protocol import SamplingParams

__all__ = [
    "DEFAULT_TIMEOUT",
    "DEFAULT_URL",
    "AuthError",
    "Connecting",
    "ConnectionError",
    "ConnectionLost",
    "EclectusClientError",
    "Gen",
    "MapSteps",
    "SamplingArgs",
    "SamplingParams",
    "SemanticFunction",
    "SemanticVariable",
    "ServerError",
    "Session",
    "SessionRefused",
    "SyncSession",
    "VarState",
    "VariableFailed",
    "connect",
    "connect_sync",
]
