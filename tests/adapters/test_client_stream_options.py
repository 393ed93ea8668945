"""A stream's get carries every get option (criteria and deadline_ms), sync and async; the
SDK's sampling defaults are the contract's."""

from __future__ import annotations

import pytest
from client_peer import FakePeer
from peer_frames import sent_gets, sent_sampling

from eclectus.adapters.client import Gen, SamplingArgs, SamplingParams, Session, connect_sync


async def test_astream_carries_the_deadline(peer: FakePeer, peer_app: Session) -> None:
    """A deadline stream's get says its deadline: without it the server ranks the stream
    as plain latency work."""
    (var,) = peer_app.call(["Q: ", Gen(max_tokens=8)])
    text = "".join([d async for d in var.astream("deadline", deadline_ms=250)])
    assert text == f"text of {var.id}"
    assert sent_gets(peer) == [
        {"var": var.id, "criteria": "deadline", "deadline_ms": 250, "stream": True}
    ]


def test_sync_stream_carries_the_deadline(peer: FakePeer) -> None:
    """The blocking stream (variable and session forms) sends the same get."""
    with connect_sync(peer.url) as app:
        (first,) = app.call(["a", Gen(max_tokens=4)])
        (second,) = app.call(["b", Gen(max_tokens=4)])
        assert "".join(first.stream("deadline", deadline_ms=900, timeout=5))
        assert "".join(app.session.stream(second, "throughput", deadline_ms=40, timeout=5))
    gets = sent_gets(peer)
    assert [(g["criteria"], g["deadline_ms"]) for g in gets] == [
        ("deadline", 900),
        ("throughput", 40),
    ]


async def test_gen_without_max_tokens_runs_to_eos(peer: FakePeer, peer_app: Session) -> None:
    """No hidden SDK default: an output without max_tokens sends none (the contract's None:
    until EOS or the context window)."""
    summarize = peer_app.function("S: {{doc}} {{out}}", out={})
    (plain,) = peer_app.call(["x", Gen()])
    await peer_app.aget_many([summarize(doc="d"), plain])
    assert [s.max_tokens for s in sent_sampling(peer)] == [None, None]
    assert Gen().sampling == SamplingParams()


def test_sampling_args_name_every_contract_field() -> None:
    """The SDK's keyword type lists exactly the contract's sampling fields."""
    assert set(SamplingArgs.__annotations__) == set(SamplingParams.model_fields)


def test_gen_takes_every_contract_field() -> None:
    """Every SamplingParams field is a Gen keyword, passed through unchanged."""
    gen = Gen(stop_token_ids=[7], ignore_eos=True, max_tokens=3)
    assert gen.sampling.stop_token_ids == (7,) and gen.sampling.ignore_eos
    with pytest.raises(ValueError, match="max_tokens"):
        Gen(max_tokens=0)
