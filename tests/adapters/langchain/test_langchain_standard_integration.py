"""LangChain's standard integration suite for ChatEclectus, against a real local server
(built-in engine, ``tiny`` model) that the conftest fixture starts."""

from __future__ import annotations

from typing import Any

import pytest
from eclectus.adapters.langchain import ChatEclectus
from langchain_tests.integration_tests import ChatModelIntegrationTests

pytestmark = pytest.mark.usefixtures("eclectus_server")


class TestChatEclectusIntegration(ChatModelIntegrationTests):
    """Every standard test that applies runs; tool calling, structured output, JSON mode
    and multimodal inputs are off through the capability flags (the server generates text
    only). The model name is left to the server's default so that ``model="tiny"`` is a
    real per-call override."""

    @property
    def chat_model_class(self) -> type[ChatEclectus]:
        return ChatEclectus

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # ignore_eos: the random-weight tiny model may pick EOS first; the suite needs text.
        return {"max_tokens": 12, "temperature": 0.0, "model_kwargs": {"ignore_eos": True}}

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False

    @property
    def supports_json_mode(self) -> bool:
        return False

    @property
    def model_override_value(self) -> str:
        return "tiny"
