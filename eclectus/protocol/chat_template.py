"""Jinja chat templates, rendered as transformers does, with or without segment boundaries.

Torch-free (jinja2 only), so the client adapters use it too: a server announces its model's
template source and the special-token strings it uses (``ModelCard.chat_template`` and
``template_vars`` in the welcome), and an adapter renders chat messages with them.

:func:`render_chat` gives the flat prompt string (what ``Tokenizer.apply_chat_template`` and
transformers give). :func:`render_chat_pieces` keeps each message's content as the pieces it
is made of (constant template text, variable values, server-side variables), so that the
boundaries reach the server as segments (seams where a shared prefix may be pinned; the
server tokenizes the flat render, with no special token added, as a stock server does).

How pieces survive rendering: the template is rendered once with each message's content
replaced by a unique marker string; the text is split on the markers and each message's
pieces are spliced in where its marker was. That is exact only if the template copies the
content verbatim, exactly once. The rule (checked, per message):

* a marker that does not come out exactly once (a template that drops, repeats, escapes or
  transforms the content) makes the whole prompt fall back;
* a message whose pieces are all known (``text_of`` gives each one's text) is checked by
  rendering again with its concrete text: if splicing the text where the marker was does not
  give the same string (``| trim`` on content with surrounding whitespace, ``| upper``...),
  that message falls back: its content is rendered as plain text, without boundaries;
* a message with an unknown piece (a value only the server will know) cannot be rendered
  as text, so the template must pass the check with a probe content that has surrounding
  whitespace and mixed case; if it does not, :class:`ChatTemplateError` is raised;
* a whole prompt that falls back is one text piece: the concrete render (if any piece is
  unknown there, :class:`ChatTemplateError`).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import jinja2
import jinja2.sandbox

T = TypeVar("T")

# "<|role|>\ncontent\n" per message, then "<|assistant|>\n" to prompt the reply: the template
# of the built-in presets, and a tokenizer's template when its directory has none. With
# ``tools`` it opens with a system turn listing them and the Hermes call format
# (eclectus.protocol.tools); an assistant turn's ``tool_calls`` are written in that format.
DEFAULT_CHAT_TEMPLATE = (
    "{% if tools %}"
    "{{ '<|system|>\n# Tools\nYou may call functions. Their signatures:\n' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\n' }}{% endfor %}"
    '{{ \'For each call write <tool_call>\n{"name": <name>, "arguments": <json>}\n'
    "</tool_call>\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' }}{{ message['content'] or '' }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% set args = call['function']['arguments'] %}"
    "{{ '\n' if loop.index > 1 or message['content'] else '' }}"
    "{{ '<tool_call>\n{\"name\": ' + call['function']['name'] | tojson + ', \"arguments\": ' }}"
    "{{ args if args is string else args | tojson }}{{ '}\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

# Content for the check of a message whose value is unknown on the client: surrounding
# whitespace and mixed case, so that trim/strip/upper/lower/capitalize show up.
_PROBE = " \n Eclectus Probe Text \n "


class ChatTemplateError(ValueError):
    """Messages cannot be rendered with a template with their boundaries kept."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' filter: jinja's own tojson HTML-escapes, which chat templates must not
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    # the environment transformers uses (same options, filters and globals), so templates
    # render identically; compiled once per template text
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render_chat(
    template: str | None,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    template_vars: Mapping[str, str] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """``messages`` ([{"role", "content"}], plus ``tool_calls`` on an assistant turn)
    rendered with the Jinja ``template`` source (None: :data:`DEFAULT_CHAT_TEMPLATE`) as
    transformers renders it; ``template_vars`` are the special-token strings (``bos_token``...)
    the template may use; ``tools`` (OpenAI tool objects) reach the template as ``tools``, as
    ``apply_chat_template(tools=...)`` passes them. Pure."""
    compiled = _compile(template or DEFAULT_CHAT_TEMPLATE)
    return compiled.render(
        messages=[dict(m) for m in messages],
        add_generation_prompt=add_generation_prompt,
        tools=None if tools is None else [dict(t) for t in tools],
        **dict(template_vars or {}),
    )


# A message for :func:`render_chat_pieces`: (role, pieces), or (role, pieces, fields) with
# the message's other fields as the template gets them (``tool_calls``, ``tool_call_id``).
PiecesMessage = tuple[str, Sequence[str | T]] | tuple[str, Sequence[str | T], Mapping[str, Any]]


def template_tool_call(call_id: str, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """One past call as an assistant message's ``tool_calls`` entry for a chat template
    (pure): OpenAI's shape, with ``arguments`` an object, as transformers' chat templates
    take it (they write ``arguments | tojson``)."""
    function = {"name": name, "arguments": dict(arguments)}
    return {"id": call_id, "type": "function", "function": function}


def render_chat_pieces(
    template: str | None,
    messages: Sequence[PiecesMessage[T]],
    *,
    text_of: Callable[[T], str | None],
    add_generation_prompt: bool = True,
    template_vars: Mapping[str, str] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[str | T]:
    """``(role, pieces)`` messages rendered with ``template`` into one list of pieces, each
    message's pieces kept as they are (the module docstring gives the fallback rule). A
    message may carry a third item, its other fields (an assistant turn's ``tool_calls``,
    see :func:`template_tool_call`; a tool result's ``tool_call_id``), which reach the
    template beside ``role`` and ``content`` as ``apply_chat_template`` passes them.

    A piece is a ``str`` (constant text) or an opaque value; ``text_of`` gives an opaque
    piece's text, or None when it is not known on the client. Constant template text comes
    out as ``str``; adjacent strings are not merged. ``tools`` as :func:`render_chat`. Pure;
    raises :class:`ChatTemplateError`
    when a message with an unknown piece cannot be spliced, and the template's own errors.
    """

    def render(contents: Sequence[str]) -> str:
        return render_chat(
            template,
            [_message(m, c) for m, c in zip(messages, contents, strict=True)],
            add_generation_prompt=add_generation_prompt,
            template_vars=template_vars,
            tools=tools,
        )

    texts = [_known_text(m[1], text_of) for m in messages]
    tag = uuid.uuid4().hex[:12]
    markers = [f"\x00ECLECTUS-MSG-{tag}-{i}\x00" for i in range(len(messages))]

    def spliced(i: int) -> bool:
        """Whether message i's known (else probe) text splices exactly into its marker."""
        text = texts[i] if texts[i] is not None else _PROBE
        filler = [t if t is not None else _PROBE for t in texts]
        with_marker = render([markers[i] if j == i else filler[j] for j in range(len(texts))])
        if with_marker.count(markers[i]) != 1:
            return False
        filler[i] = text
        return with_marker.replace(markers[i], text) == render(filler)

    keep = [spliced(i) for i in range(len(messages))]
    for i, ok in enumerate(keep):
        if not ok and texts[i] is None:
            raise ChatTemplateError(
                f"the chat template does not copy message {i}'s content verbatim, and part of "
                "it is known only on the server: it cannot be rendered on the client"
            )
    contents = [markers[i] if ok else texts[i] for i, ok in enumerate(keep)]
    rendered = render([c for c in contents if c is not None])
    out: list[str | T] = []
    rest = rendered
    for i, ok in enumerate(keep):
        if not ok:
            continue
        head, sep, rest = rest.partition(markers[i])
        if not sep or markers[i] in rest:
            return _whole(render, texts)
        out.append(head)
        out.extend(messages[i][1])
    out.append(rest)
    if all(t is not None for t in texts):
        joined = "".join(p if isinstance(p, str) else text_of(p) or "" for p in out)
        if joined != render([t for t in texts if t is not None]):
            return _whole(render, texts)
    return out


def _message(message: PiecesMessage[T], content: str) -> dict[str, Any]:
    fields = message[2] if len(message) == 3 else {}
    return {**fields, "role": message[0], "content": content}


def _known_text(pieces: Sequence[str | T], text_of: Callable[[T], str | None]) -> str | None:
    parts: list[str] = []
    for piece in pieces:
        text = piece if isinstance(piece, str) else text_of(piece)
        if text is None:
            return None
        parts.append(text)
    return "".join(parts)


def _whole(render: Callable[[Sequence[str]], str], texts: Sequence[str | None]) -> list[Any]:
    """The fallback of a whole prompt: its concrete render as one piece."""
    if any(t is None for t in texts):
        raise ChatTemplateError(
            "the chat template does not keep message contents apart, and part of one is "
            "known only on the server: it cannot be rendered on the client"
        )
    return [render([t for t in texts if t is not None])]
