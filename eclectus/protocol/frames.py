"""The Eclectus wire protocol, version 1: every frame as a pydantic v2 model.

Client and server both import this module (through :mod:`eclectus.protocol`); it imports
neither torch nor the engine, so a client-only install can use it. docs/protocol.md explains
each frame; keep the two in step.

A frame is one JSON object with a ``type`` discriminator and an optional client-chosen ``id``
that the server echoes in every reply to that frame.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictInt,
    StrictStr,
    Tag,
    TypeAdapter,
    model_validator,
)

from eclectus.protocol.limits import (
    MAX_MAP_STEPS,
    MAX_RELEASE_IDS,
    MAX_SWITCH_CASES,
    MAX_SWITCH_PATH,
    Limits,
)
from eclectus.protocol.model_card import ModelCard
from eclectus.protocol.sampling import SamplingParams

PROTOCOL_VERSION = 1

Criteria = Literal["latency", "throughput", "deadline"]
VarId = Annotated[str, Field(min_length=1, max_length=256)]


class _Frame(BaseModel):
    """Base of every frame: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str | None = Field(default=None, max_length=256)


# -- segments: the pieces of one call's prompt, in order ------------------------------------


class TextSegment(BaseModel):
    """Constant text of the template."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    text: str


class VarSegment(BaseModel):
    """An input: the text of a variable, resolved on the server."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    var: VarId


class GenSegment(BaseModel):
    """An output: the model generates this variable's text at this point of the prompt."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gen: VarId
    sampling: SamplingParams = Field(default_factory=SamplingParams)


def _segment_kind(segment: object) -> str | None:
    """The tag of the Segment member ``segment`` is meant to be (pure): for a mapping, by
    which one of the keys "text", "var", "gen" it holds; for a model, by its class. None
    (rejected as ``segment_kind``) for anything else, including a mapping with none or several
    of the keys. Called once per segment on the server's hot path, hence plain tests."""
    if isinstance(segment, (dict, Mapping)):  # dict first: the JSON case, no ABC check
        text, var, gen = "text" in segment, "var" in segment, "gen" in segment
        if text + var + gen != 1:
            return None
        return "TextSegment" if text else "VarSegment" if var else "GenSegment"
    for kind in (TextSegment, VarSegment, GenSegment):
        if isinstance(segment, kind):
            return kind.__name__
    return None


# Discriminated by which key is present, so pydantic validates against one member instead of
# trying each in turn (and its errors are that member's, not the first member's). The tags are
# the class names, the location pydantic gave a member's errors before: an error's ``field``
# reads as it did, e.g. ``calls[0].segments[2].GenSegment.sampling.max_tokens``.
Segment = Annotated[
    Annotated[TextSegment, Tag("TextSegment")]
    | Annotated[VarSegment, Tag("VarSegment")]
    | Annotated[GenSegment, Tag("GenSegment")],
    Discriminator(
        _segment_kind,
        custom_error_type="segment_kind",
        custom_error_message="a segment is an object with exactly one of the keys "
        "'text', 'var' or 'gen'",
    ),
]


# -- graph fragments ------------------------------------------------------------------------


class VarSpec(BaseModel):
    """Declares a variable. With ``value`` it is a constant input; without, something in the
    graph (a call's GenSegment, an op, or a later ``set``) produces it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: VarId
    name: str | None = Field(default=None, max_length=256)
    value: str | None = None


class CallSpec(BaseModel):
    """One semantic function call: a prompt of segments with one or more outputs.

    Either ``segments`` directly, or a ``template`` with ``{{name}}`` placeholders plus
    ``bind`` (placeholder name -> var id, for every placeholder) and ``sampling``
    (placeholder name -> spec, for the outputs). The server turns the template form into
    segments with :func:`~eclectus.protocol.templates.parse_template`, so a malformed template
    is reported there.

    The prompt before each output is the concatenation of the segments' texts, tokenized
    once as a stock server tokenizes the same text. ``add_special_tokens`` (vLLM's name and
    default): true for a completion prompt (BOS first, as the tokenizer config says); false
    for a prompt rendered with a chat template, which renders its own special tokens (what
    vLLM's ``/v1/chat/completions`` and transformers' ``apply_chat_template`` give). Every
    adapter that renders a chat template sends false.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: VarId
    model: str | None = None
    segments: list[Segment] | None = None
    template: str | None = None
    bind: dict[str, VarId] = Field(default_factory=dict)
    sampling: dict[str, SamplingParams] = Field(default_factory=dict)
    add_special_tokens: bool = True

    @model_validator(mode="after")
    def _one_form(self) -> CallSpec:
        if (self.segments is None) == (self.template is None):
            raise ValueError("a call needs exactly one of 'segments' or 'template'")
        return self


# The text ops the Python evaluator lowers app code to (adapters/pyeval), each exactly the
# Python operation on a ``str``: their arity and arguments are checked below; the server's
# evaluation (server/graph/text_ops.py) is tested against Python itself.
TextOpKind = Literal[
    "json_field", "index", "strip", "lstrip", "rstrip", "lower", "upper", "replace",
    "slice", "format", "repr",
]  # fmt: skip
OpArg = StrictStr | StrictInt | None
# op -> (number of inputs, None: one or more; allowed argument counts)
_TEXT_OP_SHAPES: dict[str, tuple[int | None, tuple[int, ...]]] = {
    "json_field": (1, (0,)),
    "index": (None, (0,)),
    "strip": (1, (0, 1)),
    "lstrip": (1, (0, 1)),
    "rstrip": (1, (0, 1)),
    "lower": (1, (0,)),
    "upper": (1, (0,)),
    "replace": (1, (2, 3)),
    "slice": (1, (3,)),
    "format": (1, (1,)),
    "repr": (1, (0,)),
}


class OpSpec(BaseModel):
    """A server-side text operator over variables (no model call).

    ``join``: ``prefix + sep.join(inputs) + suffix``.
    ``repr_list``: Python's ``repr(list_of_str)`` of the inputs, byte-identical to what
    ``str([...])`` gives on the client (LangChain renders lists that way).
    ``spread``: ``inputs`` is one variable that a map (:class:`MapSpec`) produces, and the
    op works over that JSON array's strings instead (a join of a fan-out's results).

    The text ops, each Python's own operation on the input's text ``s``:
    ``json_field``: the JSON value at ``path`` (object keys, list indices) of ``s`` parsed
    as a structured output parser parses it, a string as itself, an integer as ``str(n)``;
    ``index``: ``inputs[1:][int(s0)]`` (negative indices as Python's); ``strip`` /
    ``lstrip`` / ``rstrip`` (``args``: none, or ``[chars]``), ``lower``, ``upper``,
    ``replace`` (``[old, new]`` or ``[old, new, count]``); ``slice``: ``s[start:stop:step]``
    (``args`` the three, ints or null); ``format``: ``format(s, spec)`` (``[spec]``);
    ``repr``: ``repr(s)``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: VarId
    op: Literal["join", "repr_list"] | TextOpKind
    inputs: list[VarId] = Field(min_length=0)
    output: VarId
    sep: str = ""
    prefix: str = ""
    suffix: str = ""
    spread: bool = False
    path: list[StrictStr | StrictInt] = Field(default_factory=list, max_length=16)
    args: list[OpArg] = Field(default_factory=list, max_length=3)

    @model_validator(mode="after")
    def _one_spread_input(self) -> OpSpec:
        if self.spread and len(self.inputs) != 1:
            raise ValueError("a spread op takes exactly one input (a map's output)")
        shape = _TEXT_OP_SHAPES.get(self.op)
        if shape is None:
            if self.path or self.args:
                raise ValueError(f"op {self.op!r} takes no path or args")
            return self
        num_inputs, num_args = shape
        if self.spread or self.sep or self.prefix or self.suffix:
            raise ValueError(f"op {self.op!r} takes no sep, prefix, suffix or spread")
        if num_inputs is None and len(self.inputs) < 2:
            raise ValueError("an index op takes the index and at least one item")
        if num_inputs is not None and len(self.inputs) != num_inputs:
            raise ValueError(f"op {self.op!r} takes exactly {num_inputs} input")
        if len(self.args) not in num_args:
            raise ValueError(f"op {self.op!r} takes {' or '.join(map(str, num_args))} args")
        if self.path and self.op != "json_field":
            raise ValueError(f"op {self.op!r} takes no path")
        _check_text_args(self.op, self.args)
        return self


def _check_text_args(op: str, args: list[OpArg]) -> None:
    """The argument types of a text op, as Python's str methods take them (pure)."""
    if op in ("strip", "lstrip", "rstrip") and args and not isinstance(args[0], str | None):
        raise ValueError(f"{op}'s chars must be a string or null")
    if op == "replace":
        if not all(isinstance(a, str) for a in args[:2]):
            raise ValueError("replace takes two strings (and an integer count)")
        if len(args) == 3 and not isinstance(args[2], int):
            raise ValueError("replace's count must be an integer")
    if op == "slice":
        if not all(a is None or isinstance(a, int) for a in args):
            raise ValueError("slice's start, stop and step are integers or null")
        if args[2] == 0:
            raise ValueError("slice step cannot be zero")
    if op == "format" and not isinstance(args[0], str):
        raise ValueError("format takes a format spec string")


class MapSpec(BaseModel):
    """A fan-out on the server: one call, or a pipeline of calls, per element of a JSON
    array variable.

    When ``items`` is final, the server parses its text as a JSON array (a ```` ```json ````
    fence around it is allowed) and instantiates ``call`` once per element, with the
    variable ``element`` bound to that element's text (a string element's value, any other
    element's compact JSON). ``call`` has exactly one output; ``element`` and that output
    are names local to the map. ``output`` is then the JSON array of the instances' output
    texts, in element order; a ``spread`` op joins or renders it. No client round trip:
    the fan-out happens where the list is. ``items_path``: object keys leading from the
    parsed ``items`` to the array (a planner's ``{"steps": [...]}`` is ``["steps"]``).

    ``then``: more steps per element, run after ``call`` in order, each with exactly one
    output (a local name too) and reading ``element``, an earlier step's output or outer
    variables; an instance's result is then its last step's output. ``step_outputs``:
    empty, or one variable per step before the last (``call`` first), each the JSON array
    of that step's outputs in element order, final with the map. Limits
    (``max_map_items``, ``max_map_element_bytes``, ``MAX_MAP_STEPS``) and errors are in
    docs/protocol.md.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: VarId
    items: VarId
    items_path: list[str] = Field(default_factory=list, max_length=16)
    element: VarId
    call: CallSpec
    then: list[CallSpec] = Field(default_factory=list, max_length=MAX_MAP_STEPS - 1)
    output: VarId
    step_outputs: list[VarId] = Field(default_factory=list, max_length=MAX_MAP_STEPS - 1)


class SwitchSpec(BaseModel):
    """Routing on the server: run one branch of the graph, chosen by a variable's value.

    ``on`` is the output of a call constrained to a ``choice`` of literals (a router), or,
    with a ``path`` (object keys), of a call constrained to a JSON Schema that pins the
    field at ``path`` to an ``enum`` / ``const`` of strings (a structured router). Each
    case names, for one of those literals, the calls, ops and maps of the graph that run
    only when ``on`` is that literal (``[]``: none, say a route to the end). When ``on`` is
    final, the taken case's nodes may run; every other case's nodes are *skipped*: never
    dispatched, their outputs fail with ``skipped``, and so does whatever consumes them. A
    node is guarded by at most one switch, once. Limits (``MAX_SWITCH_CASES``,
    ``MAX_SWITCH_DEPTH``) and errors are in docs/protocol.md.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: VarId
    on: VarId
    path: list[str] = Field(default_factory=list, max_length=MAX_SWITCH_PATH)
    cases: dict[str, list[VarId]] = Field(min_length=1, max_length=MAX_SWITCH_CASES)

    @model_validator(mode="after")
    def _each_node_once(self) -> SwitchSpec:
        guarded = [node_id for nodes in self.cases.values() for node_id in nodes]
        if len(set(guarded)) != len(guarded):
            raise ValueError("a node appears in more than one case, or twice in one")
        return self


class GetSpec(BaseModel):
    """Ask for a variable's value; activates everything upstream of it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    var: VarId
    criteria: Criteria = "latency"
    deadline_ms: float | None = Field(default=None, gt=0)
    stream: bool = False


# -- client -> server -----------------------------------------------------------------------


# A client may send its hello in the WebSocket upgrade request, as this header's value (the
# frame's JSON, ASCII): the server, which says so with HELLO_ACCEPTED in its upgrade response,
# then answers welcome (or error) right after the upgrade, one round trip sooner than a hello
# frame could. A server that does not echo it gets the hello as the first frame.
HELLO_HEADER = "Eclectus-Hello"
HELLO_ACCEPTED = "accepted"


class Hello(_Frame):
    type: Literal["hello"] = "hello"
    protocol: int = PROTOCOL_VERSION
    token: str | None = None
    app: str | None = Field(default=None, max_length=256)
    tenant: str | None = Field(default=None, max_length=256)


class Submit(_Frame):
    """A graph fragment: new variables, calls, ops, maps and switches, and the gets that
    activate them.
    Later fragments may refer to variables of earlier ones in the same session."""

    type: Literal["submit"] = "submit"
    vars: list[VarSpec] = Field(default_factory=list)
    calls: list[CallSpec] = Field(default_factory=list)
    ops: list[OpSpec] = Field(default_factory=list)
    maps: list[MapSpec] = Field(default_factory=list)
    switches: list[SwitchSpec] = Field(default_factory=list)
    gets: list[GetSpec] = Field(default_factory=list)


class Get(_Frame):
    type: Literal["get"] = "get"
    var: VarId
    criteria: Criteria = "latency"
    deadline_ms: float | None = Field(default=None, gt=0)
    stream: bool = False


class Set(_Frame):
    """The client supplies the value of a declared, unproduced variable."""

    type: Literal["set"] = "set"
    var: VarId
    value: str


class Cancel(_Frame):
    """Cancel the producer of ``var``: it and everything downstream fail with 'cancelled'."""

    type: Literal["cancel"] = "cancel"
    var: VarId


class Release(_Frame):
    """The client will not mention these variables again: the server frees each one once
    nothing in the graph needs it (unknown ids are ignored). Keeps long sessions bounded."""

    type: Literal["release"] = "release"
    vars: list[VarId] = Field(max_length=MAX_RELEASE_IDS)


class Tokenize(_Frame):
    """The served model's ids of ``text``, no special token added (vLLM's ``/tokenize`` with
    ``add_special_tokens`` false); answered with ``tokens``."""

    type: Literal["tokenize"] = "tokenize"
    text: str
    model: str | None = None


class Close(_Frame):
    """End the session: the server cancels its pending work and closes the socket."""

    type: Literal["close"] = "close"


ClientFrame = Annotated[
    Hello | Submit | Get | Set | Cancel | Release | Tokenize | Close,
    Field(discriminator="type"),
]
CLIENT_FRAME = TypeAdapter(ClientFrame)


# -- server -> client -----------------------------------------------------------------------


class Welcome(_Frame):
    type: Literal["welcome"] = "welcome"
    session: str
    protocol: int = PROTOCOL_VERSION
    server_version: str
    models: list[ModelCard]
    limits: Limits


class Ack(_Frame):
    """A submit, set or cancel was accepted."""

    type: Literal["ack"] = "ack"


class Delta(_Frame):
    """Streamed text of a variable being generated (only for gets with ``stream``)."""

    type: Literal["delta"] = "delta"
    var: VarId
    text: str


class Usage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class Value(_Frame):
    """The final text of a variable; answers a get."""

    type: Literal["value"] = "value"
    var: VarId
    text: str
    usage: Usage | None = None
    finish_reason: str | None = None


class Tokens(_Frame):
    type: Literal["tokens"] = "tokens"
    count: int
    ids: list[int]


ErrorCode = Literal[
    "bad_request",
    "unknown_type",
    "unknown_var",
    "duplicate_var",
    "duplicate_producer",
    "cycle",
    "bad_template",
    "unknown_model",
    "limit_exceeded",
    "unauthorized",
    "engine_error",
    "engine_unavailable",
    "cancelled",
    "skipped",
    "protocol_version",
    "internal",
]


class Error(_Frame):
    """Something the client sent or asked for failed. The session stays open unless the
    code is ``unauthorized`` (the server then closes the socket)."""

    type: Literal["error"] = "error"
    code: ErrorCode
    message: str
    field: str | None = None
    var: str | None = None


ServerFrame = Annotated[Welcome | Ack | Delta | Value | Tokens | Error, Field(discriminator="type")]
SERVER_FRAME = TypeAdapter(ServerFrame)
