"""Turning a client's WebSocket message into a frame, or into the ``bad_request`` that says
why it is not one, without a client being able to hurt others on the way.

Everything malformed is a ServerError (never an exception that reaches the log): JSON nested
beyond the parser's depth, lone UTF-16 surrogates (no UTF-8 answer, tokenizer or log line
could carry them), frames over the size limit. A big frame's submit lists are validated in
slices with the event loop's turn between them: one pydantic call over 4,000 calls holds the
GIL, and so every session, for a tenth of a second.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from eclectus.protocol import CLIENT_FRAME, CallSpec, GetSpec, OpSpec, Submit, VarSpec
from eclectus.server.errors import LimitError, ServerError

# a JSON escape of a UTF-16 surrogate: only frames holding one need the slow surrogate scan
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = "frame holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape)"
_SLICE = 256  # submit items validated per slice
_LISTS: dict[str, TypeAdapter[Any]] = {
    "vars": TypeAdapter(list[VarSpec]),
    "calls": TypeAdapter(list[CallSpec]),
    "ops": TypeAdapter(list[OpSpec]),
    "gets": TypeAdapter(list[GetSpec]),
}


def decode(message: str | bytes, max_frame_bytes: int) -> object:
    """The message's JSON (pure); ServerError when it is too big, binary or not JSON."""
    try:
        size = len(message.encode() if isinstance(message, str) else message)
    except UnicodeEncodeError:  # a transport that passed a raw surrogate through
        raise ServerError("bad_request", _LONE_SURROGATE) from None
    if size > max_frame_bytes:
        raise LimitError(f"frame of {size} bytes, limit {max_frame_bytes}")
    if isinstance(message, bytes):
        raise ServerError("bad_request", "frames are JSON text messages, not binary")
    try:
        return json.loads(message)
    except json.JSONDecodeError as exc:
        raise ServerError("bad_request", f"frame is not JSON: {exc}") from None
    except RecursionError:
        raise ServerError("bad_request", "frame is nested too deeply") from None


def echoable_id(raw: object) -> str | None:
    """The frame's id, to echo in an answer, when it has one that can be echoed (pure)."""
    frame_id = raw.get("id") if isinstance(raw, dict) else None
    if not isinstance(frame_id, str) or _has_lone_surrogate(frame_id):
        return None
    return frame_id


def check_surrogates(message: str | bytes, raw: object) -> None:
    """ServerError if any string in the frame holds an unpaired surrogate (pure)."""
    escaped = isinstance(message, str) and _SURROGATE_ESCAPE.search(message)
    if escaped and _has_lone_surrogate(raw):
        raise ServerError("bad_request", _LONE_SURROGATE)


def validate(raw: object) -> BaseModel:
    """The frame ``raw`` is (pure); ServerError naming the first bad field."""
    try:
        return CLIENT_FRAME.validate_python(raw)
    except ValidationError as exc:
        raise validation_error(exc) from None
    except RecursionError:  # nested just under json's limit, over pydantic's
        raise ServerError("bad_request", "frame is nested too deeply") from None


async def validate_in_slices(raw: object) -> BaseModel:
    """:func:`validate`, a big submit's lists a slice at a time with the loop's turn between
    (pure). Submit has no rule across its lists, so slices validate exactly as the whole."""
    lists = {k: raw.get(k) for k in _LISTS} if isinstance(raw, dict) else {}
    if not isinstance(raw, dict) or raw.get("type") != "submit":
        return validate(raw)
    if not all(isinstance(v, list) for v in lists.values() if v is not None):
        return validate(raw)
    frame = validate({k: v for k, v in raw.items() if k not in _LISTS})
    assert isinstance(frame, Submit)
    items: dict[str, list[Any]] = {}
    for name, values in lists.items():
        items[name] = []
        for start in range(0, len(values or ()), _SLICE):
            await asyncio.sleep(0)
            try:
                items[name] += _LISTS[name].validate_python(values[start : start + _SLICE])
            except ValidationError as exc:
                raise validation_error(exc, (name, start)) from None
    return frame.model_copy(update=items)


def validation_error(exc: ValidationError, offset: tuple[str, int] | None = None) -> ServerError:
    """The first pydantic error as a ServerError naming the field (pure). ``offset``: the
    error is in a slice of that list, starting at that index."""
    first = exc.errors()[0]
    if first["type"] == "union_tag_invalid":
        return ServerError("unknown_type", first["msg"], field="type")
    if first["type"] == "union_tag_not_found":
        return ServerError("bad_request", "a frame needs a 'type' field", field="type")
    loc = list(first["loc"][1:])  # past the frame's union tag
    if offset is not None:
        loc = [offset[0], offset[1] + int(first["loc"][0]), *first["loc"][1:]]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
    return ServerError(
        "bad_request",
        f"{where.lstrip('.') or 'frame'}: {first['msg']}",
        field=where.lstrip(".") or None,
    )


def _has_lone_surrogate(raw: object) -> bool:
    """Whether any string in a decoded JSON value (keys too) holds an unpaired surrogate,
    which no UTF-8 text (and so no answer frame, tokenizer or log) can carry (pure;
    iterative, so depth costs nothing)."""
    stack = [raw]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
