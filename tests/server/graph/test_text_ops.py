"""The text ops (docs/protocol.md, OpSpec): each one is Python's own ``str`` operation, so
hypothesis checks the server's evaluation against Python itself; then the graph runs them,
bounds their size and fails an op Python would not answer with a string."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from sched_helpers import make_scheduler, submit

from eclectus.protocol import OpSpec
from eclectus.server.graph.graph import VarState, run_op
from eclectus.server.graph.text_ops import TextOpFailed

TEXT = st.text(st.characters(codec="utf-8"), max_size=40)  # any code point but surrogates
SMALL = st.integers(-50, 50)


def op(kind: str, *args: Any, inputs: tuple[str, ...] = ("a",), **fields: Any) -> OpSpec:
    return OpSpec(id="o", op=kind, inputs=list(inputs), output="out", args=list(args), **fields)


@given(TEXT, st.sampled_from(["strip", "lstrip", "rstrip"]), st.none() | TEXT)
def test_the_strips_are_pythons(text: str, kind: str, chars: str | None) -> None:
    expected = getattr(text, kind)(chars)
    assert run_op(op(kind, chars), [text]) == expected
    if chars is None:
        assert run_op(op(kind), [text]) == getattr(text, kind)()


@given(TEXT)
def test_lower_upper_and_repr_are_pythons(text: str) -> None:
    assert run_op(op("lower"), [text]) == text.lower()
    assert run_op(op("upper"), [text]) == text.upper()
    assert run_op(op("repr"), [text]) == repr(text)


@given(TEXT, TEXT, TEXT, st.none() | SMALL)
def test_replace_is_pythons(text: str, old: str, new: str, count: int | None) -> None:
    args = (old, new) if count is None else (old, new, count)
    assert run_op(op("replace", *args), [text]) == text.replace(*args)  # type: ignore[arg-type]


@given(TEXT, st.none() | SMALL, st.none() | SMALL, st.none() | SMALL.filter(bool))
def test_slice_is_pythons(text: str, start: int | None, stop: int | None, step: int | None) -> None:
    assert run_op(op("slice", start, stop, step), [text]) == text[start:stop:step]


SPECS = st.builds(
    lambda fill, align, width, precision, kind: f"{fill}{align}{width}{precision}{kind}",
    st.sampled_from(["", "*", " ", "x", "{"]),
    st.sampled_from(["", "<", ">", "^", "=", "+"]),
    st.sampled_from(["", "0", "7", "20", ","]),
    st.sampled_from(["", ".0", ".3"]),
    st.sampled_from(["", "s", "d"]),
)


@given(TEXT, SPECS)
def test_format_is_pythons(text: str, spec: str) -> None:
    """A spec Python formats a str with gives Python's text; one it refuses fails."""
    try:
        expected = format(text, spec)
    except ValueError:
        with pytest.raises(TextOpFailed):
            run_op(op("format", spec), [text])
        return
    assert run_op(op("format", spec), [text]) == expected


JSON_LEAF = st.text(max_size=20) | st.integers(-(10**30), 10**30)
JSON_VALUE = st.recursive(
    JSON_LEAF | st.booleans() | st.none() | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)


@settings(max_examples=200)
@given(JSON_VALUE, st.lists(st.text(max_size=4) | st.integers(-3, 3), max_size=3), st.booleans())
def test_json_field_reads_what_the_parser_parses(value: Any, path: list, indent: bool) -> None:
    """The field of the reply LangChain's JSON parsers parse (``json.loads`` after the
    strip they do), a string as itself, an integer as str(); any other value, or a path the
    JSON lacks, fails."""
    text = json.dumps(value, indent=2 if indent else None, ensure_ascii=indent)
    expected: Any = json.loads(text)
    try:
        for key in path:
            if not isinstance(expected, dict if isinstance(key, str) else list):
                raise KeyError(key)
            expected = expected[key]
    except (KeyError, IndexError, TypeError):
        expected = None
    spec = op("json_field", path=path)
    if isinstance(expected, str) or (type(expected) is int):
        assert run_op(spec, [f"\n {text} \n"]) == str(expected)
    else:
        with pytest.raises(Exception, match="JSON"):
            run_op(spec, [text])


@given(st.lists(TEXT, min_size=1, max_size=5), st.integers(-7, 7))
def test_index_is_pythons(items: list[str], index: int) -> None:
    spec = op("index", inputs=("i", *[f"x{n}" for n in range(len(items))]))
    if -len(items) <= index < len(items):
        assert run_op(spec, [str(index), *items]) == items[index]
    else:
        with pytest.raises(Exception, match="out of range"):
            run_op(spec, [str(index), *items])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"op": "strip", "inputs": ["a", "b"]}, "exactly 1 input"),
        ({"op": "replace", "args": ["x"]}, "2 or 3 args"),
        ({"op": "replace", "args": ["x", 3]}, "two strings"),
        ({"op": "slice", "args": [0, 5, 0]}, "step cannot be zero"),
        ({"op": "slice", "args": [0, "5", None]}, "integers or null"),
        ({"op": "index", "inputs": ["i"]}, "at least one item"),
        ({"op": "lower", "path": ["k"]}, "no path"),
        ({"op": "upper", "sep": ","}, "no sep"),
        ({"op": "join", "args": ["x"]}, "no path or args"),
        ({"op": "strip", "args": [True]}, "valid string"),
        ({"op": "strip", "args": [3]}, "string or null"),
    ],
)
def test_a_malformed_text_op_is_refused(fields: dict[str, Any], message: str) -> None:
    spec = {"id": "o", "inputs": ["a"], "output": "out", **fields}
    with pytest.raises(ValidationError, match=message):
        OpSpec(**spec)


def test_the_graph_runs_text_ops_chained_and_fails_one_python_would_refuse() -> None:
    """``" Hi ".strip().upper()`` runs on the server at once; an index out of range fails
    its output (and what reads it) with bad_request naming the op."""
    sched = make_scheduler()
    app = sched.open_app("s")
    ops = [
        {"id": "o1", "op": "strip", "inputs": ["a"], "output": "s"},
        {"id": "o2", "op": "upper", "inputs": ["s"], "output": "u"},
        {"id": "o3", "op": "index", "inputs": ["i", "a", "u"], "output": "bad"},
    ]
    variables = [{"id": "a", "value": " Hi "}, {"id": "i", "value": "5"}]
    submit(sched, app, vars=variables, ops=ops, gets=[{"var": "u"}, {"var": "bad"}])
    assert app.graph.vars["u"].value == "HI"
    bad = app.graph.vars["bad"]
    assert bad.state is VarState.FAILED and bad.error_code == "bad_request"
    assert "o3" in (bad.error_message or "") and "out of range" in (bad.error_message or "")


def test_a_text_op_over_the_size_limit_fails_before_it_is_built() -> None:
    sched = make_scheduler(max_frame_bytes=4096)
    app = sched.open_app("s")
    huge = {"id": "o", "op": "format", "inputs": ["a"], "output": "w", "args": [">100000000"]}
    submit(sched, app, vars=[{"id": "a", "value": "x"}], ops=[huge], gets=[{"var": "w"}])
    failed = app.graph.vars["w"]
    assert failed.state is VarState.FAILED and failed.error_code == "limit_exceeded"


def test_the_protocol_docs_example_runs() -> None:
    """docs/protocol.md's text-op frame, as printed, answers as the page says."""
    docs = (Path(__file__).resolve().parents[3] / "docs" / "protocol.md").read_text()
    (block,) = [b for b in re.findall(r"```json\n(.*?)```", docs, re.DOTALL) if '"s4"' in b]
    frame = json.loads(block)
    sched = make_scheduler()
    app = sched.open_app("s")
    submit(sched, app, **{k: v for k, v in frame.items() if k not in ("type", "id")})
    assert app.graph.vars["clean"].value == "Tides"
    assert app.graph.vars["chosen"].value == "second"
