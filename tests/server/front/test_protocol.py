"""Protocol models: the discriminated Segment union parses and rejects exactly what the old
member-by-member union did, its errors name what was wrong (also as the client sees them,
over a real socket), frames round-trip through the wire encoding, and the bench runs."""

from __future__ import annotations

import argparse
import json
import types
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError
from ws_helpers import RawClient

from eclectus.benchmarks.frames import (
    BASELINE_CLIENT_FRAME,
    SEGMENT_KINDS,
    BaselineSegment,
    check_same_frames,
    main,
    submit_frame,
)
from eclectus.protocol import (
    CLIENT_FRAME,
    CallSpec,
    GenSegment,
    GetSpec,
    SamplingParams,
    Segment,
    Submit,
    TextSegment,
    VarSegment,
    VarSpec,
)

SEGMENT: TypeAdapter[Any] = TypeAdapter(Segment)
BASELINE: TypeAdapter[Any] = TypeAdapter(BaselineSegment)
ONE_OF_KEYS = "a segment is an object with exactly one of the keys 'text', 'var' or 'gen'"

# every kind of segment, as dicts off the wire
WELL_FORMED: list[tuple[dict[str, Any], Any]] = [
    ({"text": "Hello "}, TextSegment(text="Hello ")),
    ({"text": ""}, TextSegment(text="")),
    ({"var": "doc"}, VarSegment(var="doc")),
    ({"gen": "out"}, GenSegment(gen="out")),
    (
        {"gen": "out", "sampling": {"max_tokens": 8, "stop": ["\n"], "top_k": 3}},
        GenSegment(gen="out", sampling=SamplingParams(max_tokens=8, stop=["\n"], top_k=3)),
    ),
]

# every way a segment can be malformed: (input, error type, location in the segment, message)
MALFORMED: list[tuple[object, str, tuple[str, ...], str]] = [
    ({}, "segment_kind", (), ONE_OF_KEYS),
    ({"colour": "red"}, "segment_kind", (), ONE_OF_KEYS),
    ({"text": "a", "var": "x"}, "segment_kind", (), ONE_OF_KEYS),
    ({"var": "x", "gen": "y"}, "segment_kind", (), ONE_OF_KEYS),
    ({"text": "a", "var": "x", "gen": "y"}, "segment_kind", (), ONE_OF_KEYS),
    ("Hello", "segment_kind", (), ONE_OF_KEYS),
    (None, "segment_kind", (), ONE_OF_KEYS),
    (["text", "a"], "segment_kind", (), ONE_OF_KEYS),
    ({"text": 1}, "string_type", ("TextSegment", "text"), "valid string"),
    ({"var": 5}, "string_type", ("VarSegment", "var"), "valid string"),
    ({"var": ""}, "string_too_short", ("VarSegment", "var"), "at least 1 character"),
    ({"gen": "y" * 257}, "string_too_long", ("GenSegment", "gen"), "at most 256 characters"),
    ({"text": "a", "colour": "red"}, "extra_forbidden", ("TextSegment", "colour"), "Extra"),
    ({"var": "x", "sampling": {}}, "extra_forbidden", ("VarSegment", "sampling"), "Extra"),
    (
        {"gen": "y", "sampling": {"max_tokens": 0}},
        "greater_than_equal",
        ("GenSegment", "sampling", "max_tokens"),
        "greater than or equal to 1",
    ),
    (
        {"gen": "y", "sampling": {"top_k": 0}},
        "value_error",
        ("GenSegment", "sampling", "top_k"),
        "top_k must be -1 (off) or >= 1",
    ),
    (
        {"gen": "y", "sampling": {"top_k": 2**70}},
        "less_than_equal",
        ("GenSegment", "sampling", "top_k"),
        "less than or equal to",
    ),
    (
        {"gen": "y", "sampling": {"seed": 2**80}},
        "less_than_equal",
        ("GenSegment", "sampling", "seed"),
        "less than or equal to",
    ),
    (
        {"gen": "y", "sampling": {"temperature": "hot"}},
        "float_parsing",
        ("GenSegment", "sampling", "temperature"),
        "valid number",
    ),
    (
        {"gen": "y", "sampling": "greedy"},
        "model_type",
        ("GenSegment", "sampling"),
        "Input should be",  # "a valid dictionary or instance of SamplingParams" / "an object"
    ),
]


def parse(adapter: TypeAdapter[Any], segment: object) -> tuple[str, object]:
    """("ok", the model) or ("error", None): whether ``adapter`` accepts ``segment``."""
    try:
        return "ok", adapter.validate_python(segment)
    except ValidationError:
        return "error", None


@pytest.mark.parametrize(("segment", "expected"), WELL_FORMED)
def test_every_segment_kind_parses_as_before(segment: dict[str, Any], expected: Any) -> None:
    assert SEGMENT.validate_python(segment) == expected
    assert SEGMENT.validate_json(json.dumps(segment)) == expected
    assert BASELINE.validate_python(segment) == expected


@pytest.mark.parametrize(("segment", "error_type", "loc", "message"), MALFORMED)
def test_malformed_segment_names_what_is_wrong(
    segment: object, error_type: str, loc: tuple[str, ...], message: str
) -> None:
    for text in (False, True):
        with pytest.raises(ValidationError) as raised:
            if text:
                SEGMENT.validate_json(json.dumps(segment))
            else:
                SEGMENT.validate_python(segment)
        errors = raised.value.errors()
        assert len(errors) == 1, errors  # one error, about the one member meant
        assert (errors[0]["type"], errors[0]["loc"]) == (error_type, loc)
        assert message in errors[0]["msg"]
    assert parse(BASELINE, segment)[0] == "error"  # the old union rejected it too


def test_model_instances_pass_through() -> None:
    """The SDK builds segments as models: they are kept as they are, and dump as before."""
    segments = [TextSegment(text="Q: "), VarSegment(var="q"), GenSegment(gen="a")]
    call = CallSpec(id="c", segments=segments)
    assert call.segments is not None
    assert all(a is b for a, b in zip(call.segments, segments, strict=True))
    assert call.model_dump(mode="json", exclude_defaults=True) == {
        "id": "c",
        "segments": [{"text": "Q: "}, {"var": "q"}, {"gen": "a"}],
    }


def test_a_mapping_that_is_not_a_dict_is_still_a_segment() -> None:
    assert SEGMENT.validate_python(types.MappingProxyType({"var": "x"})) == VarSegment(var="x")


json_leaf = st.none() | st.booleans() | st.integers(-2, 300) | st.text(max_size=6)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
sampling_ish = st.dictionaries(
    st.sampled_from(["max_tokens", "top_k", "top_p", "temperature", "stop", "seed", "x"]),
    json_value,
    max_size=3,
)
segment_ish = (
    st.dictionaries(
        st.sampled_from(["text", "var", "gen", "sampling", "colour"]),
        json_value | sampling_ish,
        max_size=3,
    )
    | json_value
)


@given(segment=segment_ish)
def test_random_segments_parse_or_fail_as_with_the_old_union(segment: object) -> None:
    assert parse(SEGMENT, segment) == parse(BASELINE, segment)


ids = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
samplings = st.builds(
    SamplingParams,
    max_tokens=st.integers(1, 4096),
    temperature=st.floats(0, 10),
    top_k=st.sampled_from([-1, 1, 50]),
    seed=st.none() | st.integers(0, 2**31),
    stop=st.lists(st.text(min_size=1, max_size=4), max_size=3),
)
segments = st.one_of(
    st.builds(TextSegment, text=st.text(max_size=20)),
    st.builds(VarSegment, var=ids),
    st.builds(GenSegment, gen=ids, sampling=samplings),
)
submits = st.builds(
    Submit,
    id=st.none() | ids,
    vars=st.lists(st.builds(VarSpec, id=ids, value=st.none() | st.text(max_size=8)), max_size=3),
    calls=st.lists(
        st.builds(CallSpec, id=ids, segments=st.lists(segments, max_size=6)), max_size=4
    ),
    gets=st.lists(st.builds(GetSpec, var=ids), max_size=2),
)


@given(frame=submits)
def test_submit_round_trips_through_the_wire(frame: Submit) -> None:
    """As the SDK encodes a frame (defaults left out), the server parses it back: the same
    frame, by the session's path and by validate_json, and the same as the old union's."""
    text = json.dumps({"type": "submit", **frame.model_dump(mode="json", exclude_defaults=True)})
    assert CLIENT_FRAME.validate_python(json.loads(text)) == frame
    assert CLIENT_FRAME.validate_json(text) == frame
    assert BASELINE_CLIENT_FRAME.validate_json(text).model_dump() == frame.model_dump()


SERVER_CASES = [
    ({"var": 5}, "calls[0].segments[1].VarSegment.var", "Input should be a valid string"),
    ({}, "calls[0].segments[1]", ONE_OF_KEYS),
    ({"text": "a", "gen": "x"}, "calls[0].segments[1]", ONE_OF_KEYS),
    ("just text", "calls[0].segments[1]", ONE_OF_KEYS),
    ({"text": "a", "colour": "red"}, "calls[0].segments[1].TextSegment.colour", "Extra inputs"),
    (
        {"gen": "x", "sampling": {"max_tokens": 0}},
        "calls[0].segments[1].GenSegment.sampling.max_tokens",
        "greater than or equal to 1",
    ),
]


@pytest.mark.parametrize(("segment", "field", "message"), SERVER_CASES)
async def test_server_answers_a_bad_segment_with_its_field(
    client: RawClient, segment: object, field: str, message: str
) -> None:
    """The error frame a client gets: bad_request, the segment's field, the reason."""
    call = {"id": "c", "segments": [{"text": "Q: "}, segment, {"gen": "a"}]}
    reply = await client.ask({"type": "submit", "id": "s", "calls": [call]})
    assert (reply["type"], reply["id"], reply["code"]) == ("error", "s", "bad_request")
    assert reply["field"] == field
    assert reply["message"].startswith(f"{field}: ") and message in reply["message"]
    ok = {"type": "submit", "calls": [{"id": "c", "segments": [{"text": "Q"}, {"gen": "a"}]}]}
    assert (await client.ask(ok))["type"] == "ack"  # the session goes on; the id is still free


def test_bench_frames_parse_alike_and_the_bench_runs(capsys: pytest.CaptureFixture[str]) -> None:
    text = submit_frame(16)
    frame = CLIENT_FRAME.validate_json(text)
    assert isinstance(frame, Submit) and len(frame.calls) == 16
    check_same_frames(text)
    main(argparse.Namespace(calls=[1, 4], repeats=1, budget_calls=4))
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [row[0] for row in rows if row and row[-1].endswith("x")] == ["1", "4", *SEGMENT_KINDS]
