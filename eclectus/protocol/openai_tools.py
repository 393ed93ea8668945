"""OpenAI-shape tools and structured outputs, for the OpenAI endpoint to wire in.

Request side, :func:`chat_constraint` reads a chat-completions body's ``tools``,
``tool_choice``, ``parallel_tool_calls``, ``response_format`` and vLLM's
``structured_outputs`` (and its older ``guided_json`` / ``guided_regex`` /
``guided_choice`` / ``guided_grammar``) into one :class:`ChatConstraint`: the tools the chat
template receives, the ``StructuredOutputs`` for ``SamplingParams`` and whether the reply is
parsed for calls. Response side, :func:`assistant_message` and :class:`ChatDeltas` turn
generated text into OpenAI's ``message`` (``content``, ``tool_calls``, finish reason
``tool_calls``) and streamed ``delta`` objects.

Torch-free, in the protocol package: the server's OpenAI endpoint and the client adapters
(ChatEclectus.bind_tools, with_structured_output, ``extra_body``) read requests the same way.
Wiring it into the endpoint is a few lines: ``chat_constraint(body)``, render the messages
with ``tools=constraint.tools``, build the sampling with :func:`with_constraint`, shape the
reply with :func:`assistant_message` / :class:`ChatDeltas`, and answer a ToolRequestError as
400 with its ``param``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eclectus.protocol.sampling import SamplingParams
from eclectus.protocol.structured import StructuredOutputs
from eclectus.protocol.tool_formats import ToolFormatName, tool_format
from eclectus.protocol.tools import StreamEvent, ToolChoice, tool_specs

# vLLM's older request fields -> the StructuredOutputs key each one sets
GUIDED_FIELDS = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


class ToolRequestError(ValueError):
    """A tools/response_format field the request got wrong; ``param`` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True, slots=True)
class ChatConstraint:
    """What a chat request's tools and formats ask for."""

    tools: list[dict[str, Any]] = field(default_factory=list)  # for the template's ``tools``
    structured_outputs: StructuredOutputs | None = None
    parse_tool_calls: bool = False  # read calls out of the reply
    tool_format: ToolFormatName = "hermes"  # the served model's call syntax (tool_formats)
    # vLLM's hermes parser keeps special tokens' text for any request with tools whose
    # tool_choice is not "none" (its adjust_request), response_format or not
    skip_special_tokens: bool = True


def chat_constraint(
    body: Mapping[str, Any], tool_format_name: ToolFormatName = "hermes"
) -> ChatConstraint:
    """The constraint of one chat-completions request body for a model whose calls are
    written in ``tool_format_name`` (pure). Raises ToolRequestError naming the field for a
    malformed one, or for two that conflict (a response format beside a forced tool call);
    ValueError for an unknown format."""
    fmt = tool_format(tool_format_name)
    try:
        specs = tool_specs(body.get("tools") or ())
    except ValueError as exc:
        raise ToolRequestError("tools", str(exc)) from None
    choice: ToolChoice | None = body.get("tool_choice") or ("auto" if specs else "none")
    if choice != "none" and not specs:
        raise ToolRequestError("tool_choice", "given without tools")
    parallel = body.get("parallel_tool_calls", True) is not False
    try:
        tool_so = fmt.constraint(specs, choice, parallel)
    except ValueError as exc:
        raise ToolRequestError("tool_choice", str(exc)) from None
    format_so = _format_constraint(body)
    if format_so is not None and tool_so is not None:
        if choice != "auto":
            raise ToolRequestError(
                "response_format", "cannot be combined with a required or named tool_choice"
            )
        tool_so = None  # auto: the reply follows the format; the tools are still shown
    return ChatConstraint(
        tools=[s.openai() for s in specs],
        structured_outputs=format_so or tool_so,
        parse_tool_calls=bool(specs) and choice != "none" and format_so is None,
        tool_format=fmt.name,
        skip_special_tokens=not (specs and choice != "none" and fmt.name == "hermes"),
    )


def _format_constraint(body: Mapping[str, Any]) -> StructuredOutputs | None:
    """response_format, vLLM's structured_outputs or a guided_* field (at most one)."""
    found: list[tuple[str, StructuredOutputs]] = []
    response_format = body.get("response_format")
    parsed = _response_format(response_format) if response_format else None
    if parsed is not None:
        found.append(("response_format", parsed))
    if body.get("structured_outputs"):
        found.append(("structured_outputs", _validated(body["structured_outputs"])))
    guided = [k for k in GUIDED_FIELDS if body.get(k)]
    if guided:
        value = {GUIDED_FIELDS[k]: body[k] for k in guided}
        found.append((guided[0], _validated(value, guided[0])))
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise ToolRequestError(found[1][0], f"give one output format, not several ({names})")
    return found[0][1] if found else None


def _response_format(value: Any) -> StructuredOutputs | None:
    if not isinstance(value, Mapping):
        raise ToolRequestError("response_format", "an object with a 'type'")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputs(json_object=True)
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise ToolRequestError(
                "response_format.json_schema.schema", "a JSON Schema object is needed"
            )
        return _validated({"json": dict(schema)}, "response_format.json_schema.schema")
    raise ToolRequestError(
        "response_format.type", f"one of 'text', 'json_object', 'json_schema', not {kind!r}"
    )


def _validated(value: Any, param: str = "structured_outputs") -> StructuredOutputs:
    try:
        return StructuredOutputs.model_validate(value)
    except ValueError as exc:
        raise ToolRequestError(param, str(exc)) from None


def with_constraint(sampling: SamplingParams, constraint: ChatConstraint) -> SamplingParams:
    """``sampling`` with the request's structured outputs (pure). A hermes request with tools
    keeps special tokens' text, as vLLM's hermes parser has it (its ``adjust_request``: some
    models mark ``<tool_call>`` special), so the text is vLLM's."""
    update: dict[str, Any] = {}
    if constraint.structured_outputs is not None:
        update["structured_outputs"] = constraint.structured_outputs
    if not constraint.skip_special_tokens:
        update["skip_special_tokens"] = False
    return sampling.model_copy(update=update) if update else sampling


def assistant_message(
    text: str, finish_reason: str | None, constraint: ChatConstraint
) -> tuple[dict[str, Any], str | None]:
    """OpenAI's assistant ``message`` for generated ``text`` and the choice's finish reason
    ("tool_calls" when the reply made calls). Pure."""
    if not constraint.parse_tool_calls:
        return {"role": "assistant", "content": text}, finish_reason
    content, calls = tool_format(constraint.tool_format).parse(text)
    if not calls:
        return {"role": "assistant", "content": text}, finish_reason
    message = {
        "role": "assistant",
        "content": content or None,
        "tool_calls": [c.openai() for c in calls],
    }
    return message, "tool_calls"


class ChatDeltas:
    """Streamed text to OpenAI ``delta`` objects (mutated by :meth:`feed` / :meth:`finish`):
    content deltas, and one ``tool_calls`` delta per complete call (its id, name and whole
    arguments at once, as vLLM's parsers send a call they read whole)."""

    def __init__(self, constraint: ChatConstraint) -> None:
        fmt = tool_format(constraint.tool_format)
        self._stream = fmt.stream() if constraint.parse_tool_calls else None
        self.num_calls = 0

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The deltas ``text`` completes (mutates)."""
        if self._stream is None:
            return [{"content": text}] if text else []
        return [self._delta(e) for e in self._stream.feed(text)]

    def finish(self, finish_reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
        """What was held back, and the finish reason ("tool_calls" after any call)."""
        deltas = [] if self._stream is None else [self._delta(e) for e in self._stream.finish()]
        return deltas, "tool_calls" if self.num_calls else finish_reason

    def _delta(self, event: StreamEvent) -> dict[str, Any]:
        if event.call is None:
            return {"content": event.content}
        self.num_calls += 1
        call = event.call.openai()
        return {"tool_calls": [{"index": event.index, **call}]}
