"""LangChain's standard unit suite for ChatEclectus (no server needed)."""

from __future__ import annotations

from typing import Any

from eclectus.adapters.langchain import ChatEclectus
from langchain_tests.unit_tests import ChatModelUnitTests


class TestChatEclectusUnit(ChatModelUnitTests):
    """Construction, standard params and env defaults. Tool calling, structured output and
    multimodal inputs do not apply: the capability flags say so."""

    @property
    def chat_model_class(self) -> type[ChatEclectus]:
        return ChatEclectus

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "tiny", "base_url": "ws://127.0.0.1:1"}

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False

    @property
    def init_from_env_params(self) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        env = {"ECLECTUS_URL": "ws://example.invalid:9", "ECLECTUS_TOKEN": "secret-token"}
        expected = {"eclectus_url": env["ECLECTUS_URL"], "eclectus_api_key": "secret-token"}
        return env, {"model": "tiny"}, expected
