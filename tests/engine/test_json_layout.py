"""JSON whitespace layouts (server/engine/json_layout.py): the bounded layout admits what
JSON printers write and never a run of blank lines; ``any`` is xgrammar's (vLLM's) and
``compact`` no whitespace at all (vLLM's ``disable_any_whitespace``). Checked on
xgrammar's own matcher, character by character."""

from __future__ import annotations

import json
from typing import Any

import pytest
import xgrammar as xgr
from hypothesis import given
from hypothesis import strategies as st

from eclectus.server.engine.engine_config import EngineConfig, JsonWhitespace
from eclectus.server.engine.json_layout import (
    COMPACT,
    MAX_INDENT_CHARS,
    bounded_ebnf,
    json_schema_grammar,
)

COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo(["a"]), max_threads=1)
OBJECT = '{"type": "object"}'
_keys = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6)
_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=3),
    max_leaves=10,
)
_objects = st.dictionaries(_keys, _values, max_size=4)


def accepts(layout: JsonWhitespace, text: str, schema: str = OBJECT) -> bool:
    """Whether the layout's grammar of ``schema`` admits exactly ``text`` (pure)."""
    compiled = COMPILER.compile_grammar(json_schema_grammar(schema, layout))
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


def inline_lists(value: Any, indent: int, depth: int = 0) -> str:
    """``value`` indented as json.dumps does, but lists on one line, as models write (pure)."""
    if isinstance(value, dict) and value:
        pad = " " * indent * (depth + 1)
        items = [
            f"{pad}{json.dumps(k)}: {inline_lists(v, indent, depth + 1)}" for k, v in value.items()
        ]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent * depth + "}"
    return json.dumps(value)


@given(_objects, st.sampled_from([None, 0, 1, 2, 4, "\t"]))
def test_bounded_admits_what_json_printers_write(value: dict[str, Any], indent: Any) -> None:
    """json.dumps output, compact or indented (2 and 4 spaces, tabs), and indented objects
    holding one-line lists are all valid in the default layout, and in ``any``."""
    for text in (json.dumps(value, indent=indent), inline_lists(value, 2)):
        if max(len(line) - len(line.lstrip()) for line in text.splitlines()) > MAX_INDENT_CHARS:
            continue
        assert accepts("bounded", text), text
        assert accepts("any", text), text
    assert accepts("compact", json.dumps(value, separators=COMPACT))


@pytest.mark.parametrize(
    "text",
    [
        '{\n\n"a": 1}',  # a blank line
        '{"a": 1,\n\n "b": 2}',
        '{"a" : 1}',  # space before a colon
        '{"a": 1 , "b": 2}',  # space before a comma
        '{"a":  1}',  # two spaces after a colon
        '{"a": 1,  "b": 2}',
        '{"a": [1,\n' + " " * (MAX_INDENT_CHARS + 1) + "2]}",  # an indent past the bound
    ],
)
def test_bounded_refuses_free_whitespace(text: str) -> None:
    """Runs of whitespace a printer never writes are refused by the default; ``any`` (stock
    vLLM's grammar) admits them, so a model could write them until max_tokens."""
    json.loads(text)
    assert not accepts("bounded", text)
    assert accepts("any", text)


def test_compact_has_no_whitespace_between_tokens() -> None:
    """vLLM's ``disable_any_whitespace`` grammar: separators ``,`` and ``:`` with nothing
    after them (xgrammar's own compact default would also want a space after each)."""
    assert accepts("compact", '{"a":[1,2],"b":{}}')
    assert not accepts("compact", '{"a": [1, 2], "b": {}}')
    assert not accepts("compact", '{\n  "a": 1\n}')


def test_bounded_keeps_the_schema() -> None:
    """Only whitespace changes: the schema's required keys and types still hold."""
    schema = json.dumps(
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    )
    assert accepts("bounded", '{\n  "n": 3\n}', schema)
    assert not accepts("bounded", '{"n": "3"}', schema)
    assert not accepts("bounded", "{}", schema)


def test_a_grammar_without_whitespace_slots_is_an_error() -> None:
    """If xgrammar stopped writing bounded whitespace as this module expects, compiling
    says so instead of silently serving a different layout."""
    with pytest.raises(RuntimeError, match="no whitespace slot"):
        bounded_ebnf('root ::= "{" "}"')


def test_an_unknown_layout_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="bounded, any, compact"):
        EngineConfig(json_whitespace="pretty")  # type: ignore[arg-type]
    assert EngineConfig().json_whitespace == "bounded"
    assert EngineConfig(json_whitespace="compact").compact_json
