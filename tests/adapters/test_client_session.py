"""The async session against the recording peer: frame economy, routing of values, deltas
and errors, and what a lost connection does."""

from __future__ import annotations

import asyncio
import json

import pytest
from client_peer import FakePeer

from eclectus.adapters.client import (
    AuthError,
    ConnectionError,
    Gen,
    SemanticVariable,
    ServerError,
    Session,
    VariableFailed,
    VarState,
    connect,
)


def one(result: SemanticVariable | tuple[SemanticVariable, ...]) -> SemanticVariable:
    """The single output of a one-output semantic function call."""
    assert isinstance(result, SemanticVariable)
    return result


async def test_issue_example_ships_the_whole_fan_out_in_one_submit(
    peer: FakePeer, peer_app: Session
) -> None:
    """Two summaries and a combine: nothing is sent until aget, then exactly one submit."""
    summarize = peer_app.function(
        "Summarize:\n{{doc}}\nSummary:{{summary}}", summary=dict(max_tokens=48)
    )
    combine = peer_app.function(
        "Combine:\n{{a}}\n{{b}}\nFinal:{{final}}", final=dict(max_tokens=64)
    )
    s1, s2 = summarize(doc="one"), summarize(doc="two")
    final = one(combine(a=s1, b=s2))
    assert peer.of_type("submit") == []
    peer.texts[final.id] = "the answer"
    assert await final.aget(criteria="latency") == "the answer"
    (submit,) = peer.of_type("submit")
    assert len(submit["calls"]) == 3 and len(submit["vars"]) == 3
    assert submit["gets"] == [{"var": final.id}]
    assert final.state is VarState.READY and final.finish_reason == "stop"
    assert final.usage is not None and final.usage.completion_tokens == len("the answer")
    assert await final.aget() == "the answer"  # answered locally: no second frame
    assert len(peer.of_type("submit")) == 1 and peer_app.num_frames_sent == 1


async def test_aget_many_gets_all_in_one_frame(peer: FakePeer, peer_app: Session) -> None:
    """aget_many: one submit carrying every get; results in the order asked."""
    f = peer_app.function("{{x}}={{y}}", y={})
    outs = [one(f(x=str(i))) for i in range(10)]
    texts = await peer_app.aget_many(outs, criteria="throughput")
    assert texts == [f"text of {v.id}" for v in outs]
    (submit,) = peer.of_type("submit")
    assert [g["criteria"] for g in submit["gets"]] == ["throughput"] * 10


async def test_constant_variable_needs_no_round_trip(peer: FakePeer, peer_app: Session) -> None:
    """A constant's value is known locally."""
    assert await peer_app.variable("hi").aget() == "hi"
    assert peer.of_type("submit") == []


async def test_stream_deltas_concatenate_to_the_value(peer: FakePeer, peer_app: Session) -> None:
    """astream yields the peer's 3-char deltas; they join to the final text."""
    (out,) = peer_app.call(["x", Gen()])
    peer.texts[out.id] = "a streamed answer"
    deltas = [d async for d in out.astream()]
    assert len(deltas) > 1 and "".join(deltas) == "a streamed answer"
    assert out.value == "a streamed answer"
    assert peer.of_type("submit")[0]["gets"] == [{"var": out.id, "stream": True}]


async def test_error_with_var_fails_only_that_variable(peer: FakePeer, peer_app: Session) -> None:
    """An engine error on one variable raises VariableFailed there; its sibling succeeds."""
    f = peer_app.function("{{x}}:{{y}}", y={})
    good, bad = one(f(x="1")), one(f(x="2"))
    peer.fail_vars[bad.id] = "engine_error"
    with pytest.raises(VariableFailed) as caught:
        await peer_app.aget_many([good, bad])
    assert caught.value.code == "engine_error" and caught.value.var == bad.id
    assert good.value == f"text of {good.id}"
    assert bad.state is VarState.FAILED
    with pytest.raises(VariableFailed):  # the failure sticks, without another frame
        await bad.aget()
    assert len(peer.of_type("submit")) == 1


async def test_rejected_submit_fails_its_variables_and_flush(
    peer: FakePeer, peer_app: Session
) -> None:
    """An error answering the submit itself fails every variable it declared."""
    peer.reject_submits = "cycle"
    f = peer_app.function("{{x}}:{{y}}", y={})
    a, b = one(f(x="1")), one(f(x="2"))
    with pytest.raises(VariableFailed) as caught:
        await a.aget()
    assert caught.value.code == "cycle" and caught.value.field == "calls"
    assert b.state is VarState.FAILED
    f(x="3")
    with pytest.raises(ServerError, match="cycle"):
        await peer_app.flush()


async def test_client_set_variable_sends_set_after_declaring(
    peer: FakePeer, peer_app: Session
) -> None:
    """aset ships the declaration first, then a set frame; the variable becomes READY."""
    slot = peer_app.variable(name="tool_result")
    await slot.aset("42")
    kinds = [f["type"] for f in peer.frames]
    assert kinds[-2:] == ["submit", "set"]
    assert peer.frames[-1]["var"] == slot.id and peer.frames[-1]["value"] == "42"
    assert slot.value == "42" and await slot.aget() == "42"


async def test_count_tokens_and_welcome_info(peer_app: Session) -> None:
    """count_tokens answers from a tokens frame; models and limits come from welcome."""
    assert await peer_app.count_tokens("three little words") == 3
    assert [m.name for m in peer_app.models] == ["tiny"]
    assert peer_app.limits.max_prompt_tokens == 4096


async def test_lost_connection_fails_pending_gets(peer: FakePeer, peer_app: Session) -> None:
    """Pending futures fail with ConnectionError when the socket drops; later use too."""
    peer.hold_gets = True
    out = one(peer_app.function("{{x}}{{y}}", y={})(x="1"))
    task = asyncio.create_task(out.aget())
    while not peer.of_type("submit"):
        await asyncio.sleep(0.01)
    await asyncio.to_thread(peer.drop_connections)
    with pytest.raises(ConnectionError, match=r"lost|closed"):
        await asyncio.wait_for(task, 5)
    assert peer_app.closed
    with pytest.raises(ConnectionError):
        peer_app.variable("x")


async def test_close_fails_waiters_and_is_idempotent(peer: FakePeer) -> None:
    """aclose sends close and fails what still waits with ConnectionError."""
    peer.hold_gets = True
    app = await connect(peer.url)
    out = app.call(["x", Gen()])[0]
    task = asyncio.create_task(out.aget())
    while not peer.of_type("submit"):
        await asyncio.sleep(0.01)
    await app.aclose()
    await app.aclose()
    with pytest.raises(ConnectionError, match="session closed"):
        await task
    # the peer records frames on its own loop: the close handshake can finish before its
    # handler has taken the close frame from its queue (this once failed CI)
    for _ in range(500):
        if peer.frames[-1]["type"] == "close":
            break
        await asyncio.sleep(0.01)
    assert peer.frames[-1]["type"] == "close"


async def test_auth_error_on_bad_token() -> None:
    """A refused hello raises AuthError; the right token connects."""
    guarded = FakePeer(token="s3cret")
    with guarded.running():
        with pytest.raises(AuthError) as caught:
            await connect(guarded.url, token="wrong")
        assert caught.value.code == "unauthorized"
        async with connect(guarded.url, token="s3cret") as app:
            assert app.session_id == "peer-session"


async def test_token_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without token=, ECLECTUS_TOKEN is sent."""
    monkeypatch.setenv("ECLECTUS_TOKEN", "from-env")
    guarded = FakePeer(token="from-env")
    with guarded.running():
        async with connect(guarded.url) as app:
            assert not app.closed
        assert guarded.of_type("hello")[0]["token"] == "from-env"


async def test_a_server_that_ignores_the_hello_header_gets_a_hello_frame() -> None:
    """The peer does not answer the upgrade's hello header (an older server): the client
    sends the hello as its first frame and the session opens."""
    peer = FakePeer()
    with peer.running():
        async with connect(peer.url, app="summarizer") as app:
            assert app.session_id == "peer-session"
        assert [f.get("app") for f in peer.of_type("hello")] == ["summarizer"]
        assert peer.frames[0]["type"] == "hello"


async def test_unreachable_server_is_a_connection_error() -> None:
    """Nothing listening: ConnectionError (also an OSError) naming the URL."""
    with pytest.raises(ConnectionError, match=r"127\.0\.0\.1:9"):
        await connect("ws://127.0.0.1:9", timeout=2)


async def test_fragment_over_max_frame_bytes_is_split() -> None:
    """A fragment over the server's max_frame_bytes travels as several valid submits:
    declarations first, gets last, every frame within the limit."""
    small = FakePeer(max_frame_bytes=2_000)
    with small.running():
        async with connect(small.url) as app:
            f = app.function("{{x}}{{y}}", y={})
            outs = [one(f(x="z" * 100)) for _ in range(40)]
            assert await app.aget_many(outs) == [f"text of {v.id}" for v in outs]
            submits = small.of_type("submit")
            assert len(submits) > 1
            assert all(len(json.dumps(s, separators=(",", ":"))) <= 2_000 for s in submits)
            first_call = next(i for i, s in enumerate(submits) if s.get("calls"))
            assert all(not s.get("calls") for s in submits[:first_call])  # vars lead
            assert sum(len(s.get("calls", [])) for s in submits) == 40
            assert sum(len(s.get("gets", [])) for s in submits) == 40
        assert not small.invalid


async def test_item_over_max_frame_bytes_fails_locally() -> None:
    """A single call larger than max_frame_bytes fails its output without being sent."""
    small = FakePeer(max_frame_bytes=2_000)
    with small.running():
        async with connect(small.url) as app:
            f = app.function("{{x}}{{y}}", y={})
            ok, huge = one(f(x="fine")), one(f(x="z" * 3_000))
            with pytest.raises(VariableFailed, match="max_frame_bytes"):
                await app.aget_many([ok, huge])
            assert huge.state is VarState.FAILED
            sent_calls = [c for s in small.of_type("submit") for c in s.get("calls", [])]
            assert all("z" * 3_000 not in json.dumps(c) for c in sent_calls)


async def test_cancel_sends_declaration_then_cancel(peer: FakePeer, peer_app: Session) -> None:
    """acancel flushes the declaring fragment, then sends cancel and waits for its ack."""
    (out,) = peer_app.call(["x", Gen()])
    await out.acancel()
    assert [f["type"] for f in peer.frames[-2:]] == ["submit", "cancel"]
    assert peer.frames[-1]["var"] == out.id


async def test_concurrent_streams_of_one_variable_share_one_get(
    peer: FakePeer, peer_app: Session
) -> None:
    """Two consumers streaming one variable: one streamed get, each sees the exact text."""
    (out,) = peer_app.call(["x", Gen()])
    peer.texts[out.id] = "shared streamed text"

    async def consume() -> str:
        return "".join([d async for d in out.astream()])

    assert await asyncio.gather(consume(), consume()) == ["shared streamed text"] * 2
    gets = [g for s in peer.of_type("submit") for g in s["gets"]]
    assert gets == [{"var": out.id, "stream": True}]


async def test_second_get_with_a_new_objective_is_sent(peer: FakePeer, peer_app: Session) -> None:
    """A pending throughput get upgraded to latency sends one more get; a repeat does not."""
    peer.hold_gets = True
    (out,) = peer_app.call(["x", Gen()])
    waits = [asyncio.create_task(out.aget(c)) for c in ("throughput", "latency", "latency")]
    while len([g for s in peer.of_type("submit") for g in s["gets"]]) < 2:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    gets = [g for s in peer.of_type("submit") for g in s["gets"]]
    assert gets == [{"var": out.id, "criteria": "throughput"}, {"var": out.id}]
    for task in waits:
        task.cancel()


async def test_dropped_variables_are_released_after_the_submit() -> None:
    """Once half a per-session limit was shipped, variables nobody holds are released, in a
    frame after the submit that may still use them; below that, no release frame."""
    small = FakePeer(max_vars_per_session=20, max_calls_per_session=8)  # releases at 10 / 4
    with small.running():
        async with connect(small.url) as app:
            (first,) = app.call(["a", Gen()])
            await first.aget()
            assert small.of_type("release") == []
            dropped_ids = [app.variable("x").id for _ in range(12)]
            kept = app.variable("keep")
            (out,) = app.call([kept, Gen()])
            await out.aget()
            while not small.of_type("release"):  # sent after the submit; may land later
                await asyncio.sleep(0.01)
            assert [f["type"] for f in small.frames[-2:]] == ["submit", "release"]
            assert small.frames[-1]["vars"] == dropped_ids
        assert not small.invalid
