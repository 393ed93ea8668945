"""The tool_choice forms both adapters accept (eclectus.adapters.tool_choice): LangChain and
LlamaIndex read every shared form alike, differing only where their frameworks do."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eclectus.adapters.langchain.tools import tool_choice_of as langchain_choice
from eclectus.adapters.llamaindex.tools import tool_choice_of as llamaindex_choice
from eclectus.adapters.tool_choice import named_choice, openai_tool_choice

SHARED = st.one_of(
    st.sampled_from(["auto", "none", "required", "any"]),
    st.text(min_size=1, max_size=12),
    st.text(min_size=1, max_size=12).map(named_choice),
)


@given(SHARED)
def test_both_adapters_read_the_shared_forms_alike(choice: Any) -> None:
    expected = openai_tool_choice(choice)
    assert langchain_choice(choice, []) == expected
    assert llamaindex_choice(choice, tool_required=False) == expected


def test_the_forms_in_openais_shape() -> None:
    assert openai_tool_choice("any") == "required"
    assert openai_tool_choice("get_weather") == named_choice("get_weather")
    assert openai_tool_choice(named_choice("add")) == {
        "type": "function",
        "function": {"name": "add"},
    }
    with pytest.raises(ValueError, match="unsupported tool_choice 3"):
        openai_tool_choice(3)


def test_only_the_edges_differ() -> None:
    """None: LangChain sends none, LlamaIndex "auto" (or "required" with tool_required)."""
    assert langchain_choice(None, []) is None
    assert llamaindex_choice(None, tool_required=False) == "auto"
    assert llamaindex_choice(None, tool_required=True) == "required"
