"""The contracts the layers share, owned by none of them.

The wire frames (:mod:`.frames`), the one sampling type (:mod:`.sampling`), the model card
(:mod:`.model_card`), the limits (:mod:`.limits`), ``{{name}}`` templates (:mod:`.templates`)
and the chat-template renderer (:mod:`.chat_template`). The SDK, the adapters, the server, the
OpenAI endpoint and the engine import them from here; this package imports nothing of theirs
(and no torch), so a client-only install has all of it.
"""

from eclectus.protocol.frames import (
    CLIENT_FRAME,
    PROTOCOL_VERSION,
    SERVER_FRAME,
    Ack,
    CallSpec,
    Cancel,
    ClientFrame,
    Close,
    Criteria,
    Delta,
    Error,
    ErrorCode,
    GenSegment,
    Get,
    GetSpec,
    Hello,
    MapSpec,
    OpSpec,
    Release,
    Segment,
    ServerFrame,
    Set,
    Submit,
    SwitchSpec,
    TextSegment,
    Tokenize,
    Tokens,
    Usage,
    Value,
    VarId,
    VarSegment,
    VarSpec,
    Welcome,
)
from eclectus.protocol.limits import (
    MAX_RELEASE_IDS,
    MAX_SWITCH_CASES,
    MAX_SWITCH_DEPTH,
    MAX_SWITCH_PATH,
    Limits,
)
from eclectus.protocol.model_card import ModelCard
from eclectus.protocol.sampling import COMPLETIONS_DEFAULT_MAX_TOKENS, SamplingParams
from eclectus.protocol.structured import StructuredOutputs
from eclectus.protocol.templates import TemplateError, parse_template, template_placeholders

__all__ = [
    "CLIENT_FRAME",
    "COMPLETIONS_DEFAULT_MAX_TOKENS",
    "MAX_RELEASE_IDS",
    "MAX_SWITCH_CASES",
    "MAX_SWITCH_DEPTH",
    "MAX_SWITCH_PATH",
    "PROTOCOL_VERSION",
    "SERVER_FRAME",
    "Ack",
    "CallSpec",
    "Cancel",
    "ClientFrame",
    "Close",
    "Criteria",
    "Delta",
    "Error",
    "ErrorCode",
    "GenSegment",
    "Get",
    "GetSpec",
    "Hello",
    "Limits",
    "MapSpec",
    "ModelCard",
    "OpSpec",
    "Release",
    "SamplingParams",
    "Segment",
    "ServerFrame",
    "Set",
    "StructuredOutputs",
    "Submit",
    "SwitchSpec",
    "TemplateError",
    "TextSegment",
    "Tokenize",
    "Tokens",
    "Usage",
    "Value",
    "VarId",
    "VarSegment",
    "VarSpec",
    "Welcome",
    "parse_template",
    "template_placeholders",
]
