"""One default server URL: the SDK's DEFAULT_URL, which the framework adapters fall back to."""

from __future__ import annotations

import pytest

from eclectus.adapters.client import DEFAULT_URL
from eclectus.adapters.langchain import ChatEclectus, EclectusLLM
from eclectus.adapters.llamaindex import Eclectus
from eclectus.server.config import ServerConfig


def test_default_url_is_where_eclectus_serve_listens_by_default() -> None:
    """DEFAULT_URL names the host and port a plain `eclectus serve` binds."""
    defaults = ServerConfig()
    assert f"ws://{defaults.host}:{defaults.port}" == DEFAULT_URL


def test_adapters_fall_back_to_the_sdk_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ECLECTUS_URL unset, every adapter model targets the SDK's DEFAULT_URL."""
    monkeypatch.delenv("ECLECTUS_URL", raising=False)
    assert ChatEclectus().eclectus_url == DEFAULT_URL
    assert EclectusLLM().eclectus_url == DEFAULT_URL
    llm = Eclectus()
    try:
        assert llm.base_url == DEFAULT_URL
    finally:
        llm.close()
