"""Lowering of the JSON output parsers ``with_structured_output`` ends in.

``JsonOutputParser`` / ``PydanticOutputParser`` over a symbolic reply become a
:class:`SymParsed`: nothing runs yet; whoever needs the value resolves it and the parser runs
on the client over the reply, exactly as eagerly. What it adds is the constraint's JSON
Schema: a reply constrained to it is valid by construction, so the LangGraph compiler can
fan out over a list inside it on the server (adapters/langgraph/fanout.py).
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser

from eclectus.adapters.langchain.compiler.context import Lowering
from eclectus.adapters.langchain.compiler.registry import register
from eclectus.adapters.langchain.compiler.symbols import SymParsed
from eclectus.adapters.langchain.errors import NotLowerable
from eclectus.adapters.langchain.pieces import Ref, SymMessage


@register(JsonOutputParser, PydanticOutputParser)
async def lower_json_parser(parser: Any, value: Any, ctx: Lowering) -> SymParsed:
    if not isinstance(value, SymMessage | Ref):  # a chat reply or a completion's text
        raise NotLowerable(f"{type(parser).__name__} over {type(value).__name__}")
    ctx.trace.node(f"{type(parser).__name__} (runs where the value is needed)")
    return SymParsed(value, parser, reply_schema(value))


def reply_schema(reply: SymMessage | Ref) -> dict[str, Any] | None:
    """The JSON Schema the reply's call is constrained to, or None (pure)."""
    ref = reply.ref if isinstance(reply, SymMessage) else reply
    constraint = getattr(ref.var, "_constraint", None)
    text = getattr(constraint, "json_schema", None)
    return json.loads(text) if text else None
