"""Served model names: announced in welcome, and a call naming another model is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from ws_helpers import RawClient, ServerFactory

from eclectus.server.config import ServerConfig
from eclectus.server.errors import ServerError


def call(model: str | None) -> dict:
    spec: dict = {"id": "c1", "segments": [{"text": "Hi"}, {"gen": "out"}]}
    if model is not None:
        spec["model"] = model
    spec["segments"][1]["sampling"] = {"max_tokens": 2}
    return {"type": "submit", "id": "s", "calls": [spec], "gets": [{"var": "out"}]}


async def test_default_name_is_the_model_and_others_are_refused(
    make_server: ServerFactory,
) -> None:
    """Without --served-model-name the backend's own name is served; 'gpt-4' is not."""
    server = await make_server()
    async with connect(server.url) as ws:
        client = RawClient(ws)
        welcome = await client.hello()
        assert [m["name"] for m in welcome["models"]] == ["tiny"]
        refused = await client.ask(call("gpt-4"))
        assert refused["code"] == "unknown_model" and refused["field"] == "calls[0].model"
        assert "'gpt-4'" in refused["message"] and "'tiny'" in refused["message"]
        assert (await client.ask(call("tiny")))["type"] == "ack"


async def test_several_served_names_all_work(make_server: ServerFactory) -> None:
    """Each served name gets its own card in welcome and is accepted by submit and tokenize."""
    server = await make_server(served_model_names=("tiny", "my-model"))
    async with connect(server.url) as ws:
        client = RawClient(ws)
        welcome = await client.hello()
        assert [m["name"] for m in welcome["models"]] == ["tiny", "my-model"]
        assert len({m["context_window"] for m in welcome["models"]}) == 1
        assert (await client.ask(call("my-model")))["type"] == "ack"
        assert (await client.values(1))["out"]["type"] == "value"
        reply = await client.ask({"type": "tokenize", "id": "t", "text": "a", "model": "x"})
        assert reply["code"] == "unknown_model"
        reply = await client.ask({"type": "tokenize", "id": "t", "text": "a", "model": "tiny"})
        assert reply["type"] == "tokens"


@given(st.one_of(st.none(), st.sampled_from(["tiny", "my-model", "gpt-4"]), st.text(max_size=8)))
def test_check_model_refuses_exactly_what_serves_refuses(name: str | None) -> None:
    """The WebSocket API's check and the OpenAI API's (ServerConfig.serves) are one rule."""
    config = ServerConfig(served_model_names=("tiny", "my-model"))
    assert config.serves(name) == (name is None or name in ("tiny", "my-model"))
    if config.serves(name):
        config.check_model(name, "model")
    else:
        with pytest.raises(ServerError, match="not served here"):
            config.check_model(name, "model")
