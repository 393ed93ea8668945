"""Random frames never crash the server: every frame is answered, the session stays open."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripted_engine import ScriptedEngine
from websockets.sync.client import ClientConnection, connect

from eclectus.server.config import ServerConfig
from eclectus.server.front.app import EclectusServer, serve_in_thread

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ids = st.sampled_from(["a", "b", "c", "x", "doc", "out"])
sampling = st.fixed_dictionaries(
    {},
    optional={
        "max_tokens": st.integers(-2, 8),
        "top_k": st.integers(-2, 3),
        "temperature": st.floats(-1, 2),
    },
)
segment = st.one_of(
    st.fixed_dictionaries({"text": st.text(max_size=10)}),
    st.fixed_dictionaries({"var": ids}),
    st.fixed_dictionaries({"gen": ids}, optional={"sampling": sampling}),
)
call = st.one_of(
    st.fixed_dictionaries({"id": ids, "segments": st.lists(segment, max_size=4)}),
    st.fixed_dictionaries(
        {
            "id": ids,
            "template": st.sampled_from(["{{a}} {{out}}", "{{a", "x}}", "{{out}}", "{{a}}{{a}}"]),
            "bind": st.dictionaries(st.sampled_from(["a", "out"]), ids, max_size=2),
            "sampling": st.dictionaries(st.sampled_from(["out", "a"]), sampling, max_size=1),
        }
    ),
)
var_spec = st.fixed_dictionaries({"id": ids}, optional={"value": st.text(max_size=8)})
valid_ish = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.just("submit"),
            "vars": st.lists(
                st.fixed_dictionaries({"id": ids}, optional={"value": st.text(max_size=8)}),
                max_size=3,
            ),
            "calls": st.lists(call, max_size=3),
            "ops": st.lists(
                st.fixed_dictionaries(
                    {
                        "id": ids,
                        "op": st.sampled_from(["join", "repr_list", "bogus"]),
                        "inputs": st.lists(ids, max_size=3),
                        "output": ids,
                    }
                ),
                max_size=2,
            ),
            "gets": st.lists(
                st.fixed_dictionaries(
                    {"var": ids},
                    optional={
                        "criteria": st.sampled_from(["latency", "throughput", "deadline", "x"]),
                        "stream": st.booleans(),
                    },
                ),
                max_size=2,
            ),
        }
    ),
    st.fixed_dictionaries({"type": st.just("release"), "vars": st.lists(ids, max_size=3)}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["get", "set", "cancel", "hello", "nope"]), "var": ids},
        optional={"value": st.text(max_size=5)},
    ),
    json_values,
)


# the module-scoped server is shared on purpose: examples must not see each other's state,
# and they cannot, since each example opens its own session
FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[EclectusServer]:
    with serve_in_thread(ServerConfig(port=0, max_frame_bytes=4096), ScriptedEngine) as server:
        yield server


def probe(ws: ClientConnection) -> None:
    """The session still answers: drain replies until the tokenize probe's answer."""
    ws.send(json.dumps({"type": "tokenize", "id": "probe", "text": "ok"}))
    for _ in range(100):
        frame = json.loads(ws.recv(timeout=5))
        assert frame["type"] in ("ack", "value", "delta", "error", "tokens", "welcome")
        if frame.get("id") == "probe":
            assert frame["type"] == "tokens"
            return
    raise AssertionError("no answer to the probe")


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(frames=st.lists(valid_ish, min_size=1, max_size=5))
def test_random_frames_are_answered(fuzz_server: EclectusServer, frames: list[Any]) -> None:
    with connect(fuzz_server.url) as ws:
        ws.send(json.dumps({"type": "hello"}))
        assert json.loads(ws.recv(timeout=5))["type"] == "welcome"
        for frame in frames:
            ws.send(json.dumps(frame))
            probe(ws)


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=st.binary(max_size=64) | st.text(max_size=64))
def test_random_bytes_and_text_are_answered(fuzz_server: EclectusServer, raw: bytes | str) -> None:
    with connect(fuzz_server.url) as ws:
        ws.send(json.dumps({"type": "hello"}))
        ws.recv(timeout=5)
        ws.send(raw)
        probe(ws)
    assert fuzz_server.metrics.sessions <= 1
