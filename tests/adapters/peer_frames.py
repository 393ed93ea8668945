"""Reading what a client sent to the recording peer: its gets and its generated outputs'
sampling (a module of its own so that every test folder can import it)."""

from __future__ import annotations

from typing import Any

from client_peer import FakePeer

from eclectus.protocol import SamplingParams


def sent_gets(peer: FakePeer) -> list[dict[str, Any]]:
    """Every get the client shipped, in order (inside ``submit`` frames)."""
    return [get for frame in peer.of_type("submit") for get in frame.get("gets", [])]


def sent_sampling(peer: FakePeer) -> list[SamplingParams]:
    """The sampling of every generated output the client declared, in order; a field the
    client left out is the contract's default."""
    return [
        SamplingParams.model_validate(segment.get("sampling", {}))
        for frame in peer.of_type("submit")
        for call in frame.get("calls", [])
        for segment in call["segments"]
        if "gen" in segment
    ]
