"""The ``tool_choice`` forms both framework adapters accept, in OpenAI's shape.

LangChain and LlamaIndex differ only at the edges (what None means, LangChain's ``True``);
each adapter handles those and hands the rest here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eclectus.protocol.tools import ToolChoice


def named_choice(name: str) -> dict[str, Any]:
    """OpenAI's choice of the one tool ``name`` (pure)."""
    return {"type": "function", "function": {"name": name}}


def openai_tool_choice(tool_choice: Any) -> ToolChoice:
    """``tool_choice`` in OpenAI's shape (pure): ``"auto"``, ``"none"`` and ``"required"`` as
    they are, ``"any"`` as ``"required"``, a tool's bare name as its named choice, OpenAI's
    own ``{"type": "function", ...}`` copied. ValueError for anything else."""
    if tool_choice in ("auto", "none", "required"):
        return tool_choice
    if tool_choice == "any":
        return "required"
    if isinstance(tool_choice, str):
        return named_choice(tool_choice)
    if isinstance(tool_choice, Mapping):
        return dict(tool_choice)
    raise ValueError(f"unsupported tool_choice {tool_choice!r}")
