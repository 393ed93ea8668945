"""Building blocks of the xgrammar structural tags that constrain tool calls (pure, JSON
objects only): a call's tag (fixed opening text, the tool's parameter schema, fixed closing
text), tags joined by a separator, tags triggered inside free text. The per-format shapes
are in :mod:`eclectus.protocol.tool_formats`; xgrammar's format is documented with
``xgrammar.Grammar.from_structural_tag``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from eclectus.protocol.structured import StructuredOutputs
from eclectus.protocol.tools import ToolChoice, ToolSpec

_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def json_string(text: str) -> str:
    """``text`` as a JSON string literal, as the model writes a tool's name."""
    return json.dumps(text, ensure_ascii=False)


def call_tag(begin: str, tool: ToolSpec, end: str) -> dict[str, Any]:
    """One call of ``tool``: ``begin``, arguments valid against its schema, ``end``."""
    schema = dict(tool.parameters or _EMPTY_PARAMETERS)
    content = {"type": "json_schema", "json_schema": schema}
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def at_most_one(tool_choice: ToolChoice | None, parallel: bool) -> bool:
    """Whether at most one call is allowed: a named tool, or parallel calls off."""
    return tool_choice not in (None, "auto", "required", "any") or not parallel


def triggered_tags(triggers: list[str], tags: list[dict[str, Any]], single: bool) -> dict[str, Any]:
    """Free text in which each ``trigger`` (a prefix of some tag's begin) opens a tag."""
    return {
        "type": "triggered_tags",
        "triggers": triggers,
        "tags": tags,
        "stop_after_first": single,
    }


def tags_with_separator(tags: list[dict[str, Any]], separator: str, single: bool) -> dict[str, Any]:
    """One or more tags (one when ``single``) joined by ``separator``, nothing else."""
    return {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": separator,
        "at_least_one": True,
        "stop_after_first": single,
    }


def structural_tag(fmt: Mapping[str, Any]) -> StructuredOutputs:
    """The constraint of a structural-tag ``format``."""
    return StructuredOutputs(structural_tag={"type": "structural_tag", "format": dict(fmt)})
