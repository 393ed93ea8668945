"""The whitespace a JSON grammar allows between tokens (``EngineConfig.json_whitespace``).

Three layouts, for the ``json`` and ``json_object`` constraints:

* ``"bounded"`` (the default): xgrammar's compact separators, with at most one line break
  and indentation in each place a printer puts one. Nothing before ``,`` and ``:``; one
  space after ``:``; after ``,`` one space, or a newline and up to :data:`MAX_INDENT_CHARS`
  spaces or tabs; after ``{`` and ``[`` and before ``}`` and ``]`` nothing, or such a
  newline and indentation. ``json.dumps`` output with or without ``indent`` is allowed, and
  so are single-line arrays inside an indented object, as models often write them; a model
  can no longer fill its budget with whitespace (a place holds at most one line break).
* ``"any"``: xgrammar's default, and stock vLLM's: any run of whitespace anywhere between
  tokens (a model that prefers whitespace may write it until ``max_tokens``).
* ``"compact"``: no whitespace between tokens at all (``{"a":[1,2]}``), the grammar stock
  vLLM builds for ``disable_any_whitespace`` (separators ``,`` and ``:``), so greedy
  replies equal that vLLM's token for token.

xgrammar 0.2.9 has no such middle layout (its ``max_whitespace_cnt`` bounds each run's
length, blank lines included; ``indent`` fixes one indentation for every line). The bounded
layout is xgrammar's own grammar with every whitespace slot replaced by the rule for its
place; the slots are found by a sentinel count, so the schema's rules are xgrammar's
exactly. Pure functions.
"""

from __future__ import annotations

import re

import xgrammar as xgr

from eclectus.server.engine.engine_config import JsonWhitespace

MAX_INDENT_CHARS = 32  # after a line break: nesting depth 8 at 4 spaces a level
# vLLM's separators for disable_any_whitespace (v1/structured_output/backend_xgrammar.py):
# xgrammar's own compact default keeps a space after each, which vLLM's grammar refuses
COMPACT = (",", ":")

# xgrammar writes each bounded whitespace slot as `whitespace_N{0, SENTINEL}`; a count no
# schema rule of its own uses, so only those slots match
_SENTINEL = 7
_SLOT = r"whitespace(?:_\d+)?\{0, " + str(_SENTINEL) + r"\}"
_BEFORE_SEPARATOR = re.compile(_SLOT + r' (?="[,:]")')
_AFTER_COLON = re.compile(r'(?<=":" )' + _SLOT)
_AFTER_COMMA = re.compile(r'(?<="," )' + _SLOT)
_ANY_SLOT = re.compile(_SLOT)
_LINE_BREAK = f'"\\n" [ \\t]{{0, {MAX_INDENT_CHARS}}}'
_RULES = f'\neclectus_comma_ws ::= " " | {_LINE_BREAK}\neclectus_edge_ws ::= "" | {_LINE_BREAK}\n'


def json_schema_grammar(schema: str, whitespace: JsonWhitespace) -> xgr.Grammar:
    """The grammar of JSON values valid against ``schema`` (JSON text) in the ``whitespace``
    layout (pure). RuntimeError from xgrammar for a schema it cannot convert."""
    if whitespace == "any":
        return xgr.Grammar.from_json_schema(schema, any_whitespace=True)
    if whitespace == "compact":  # as vLLM builds it for disable_any_whitespace
        return xgr.Grammar.from_json_schema(schema, any_whitespace=False, separators=COMPACT)
    grammar = xgr.Grammar.from_json_schema(
        schema, any_whitespace=True, max_whitespace_cnt=_SENTINEL
    )
    return xgr.Grammar.from_ebnf(bounded_ebnf(str(grammar)))


def bounded_ebnf(ebnf: str) -> str:
    """xgrammar's EBNF of a JSON grammar built with ``max_whitespace_cnt`` = the sentinel,
    each whitespace slot replaced by the bounded layout's rule for its place (pure)."""
    text = _BEFORE_SEPARATOR.sub("", ebnf)
    text = _AFTER_COLON.sub('" "', text)
    text = _AFTER_COMMA.sub("eclectus_comma_ws", text)
    text, num_edges = _ANY_SLOT.subn("eclectus_edge_ws", text)
    if not num_edges:  # xgrammar changed how it writes whitespace
        raise RuntimeError("the JSON grammar has no whitespace slot to bound")
    return text + _RULES
