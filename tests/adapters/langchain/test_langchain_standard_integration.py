"""LangChain's standard integration suite for ChatEclectus, against a real local server
(built-in engine, ``tiny`` model) that the conftest fixture starts."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_tests.integration_tests import ChatModelIntegrationTests

from eclectus.adapters.langchain import ChatEclectus

# Long enough to span whole KV blocks, so the second call reads it from the prefix cache.
SHARED_PREAMBLE = "You are a careful assistant. Answer briefly and plainly. " * 6

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

    @property
    def supported_usage_metadata_details(self) -> dict[str, list[Any]]:
        return {"invoke": ["cache_read_input"], "stream": ["cache_read_input"]}

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        """The second call with a long shared prompt reads its prefix from the cache."""
        model = self.chat_model_class(**self.chat_model_params)
        model.invoke(SHARED_PREAMBLE + "first")
        if not stream:
            message = model.invoke(SHARED_PREAMBLE + "second")
        else:
            full: AIMessageChunk | None = None
            for chunk in model.stream(SHARED_PREAMBLE + "second"):
                full = chunk if full is None else full + chunk
            assert full is not None
            message = AIMessage(content=full.content, usage_metadata=full.usage_metadata)
        assert message.usage_metadata is not None
        # not just an int: the server really served the shared preamble from its cache
        assert message.usage_metadata["input_token_details"]["cache_read"] > 0
        return message
