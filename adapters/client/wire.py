"""Frame encoding: compact JSON for the client's frames, validated parsing of the server's.

Client frames leave out every field at its default (a sampling spec that only sets
``max_tokens`` travels as ``{"max_tokens": 48}``), which keeps a wide fan-out's single
``submit`` small; the discriminator ``type`` and the hello's ``protocol`` always travel.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from eclectus.protocol import SERVER_FRAME, Hello, ServerFrame


def encode_frame(frame: BaseModel, *, ascii_only: bool = False) -> str:
    """The JSON text of a client frame, defaults omitted (pure); ``ascii_only`` escapes
    non-ASCII characters, for an HTTP header value."""
    body: dict[str, Any] = frame.model_dump(mode="json", exclude_defaults=True)
    head: dict[str, Any] = {"type": frame.type}  # type: ignore[attr-defined]
    if isinstance(frame, Hello):
        head["protocol"] = frame.protocol  # the server checks it; never leave it implicit
    return json.dumps({**head, **body}, separators=(",", ":"), ensure_ascii=ascii_only)


def decode_frame(raw: str | bytes) -> ServerFrame:
    """Parses and validates one server frame; raises pydantic.ValidationError (pure)."""
    return SERVER_FRAME.validate_json(raw)
