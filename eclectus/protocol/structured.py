"""Structured-output constraints of one output: what its text must match, by construction.

Named as vLLM's ``StructuredOutputsParams`` (``SamplingParams.structured_outputs``), so a
vLLM request carries over as it is: exactly one of

* ``json``: a JSON Schema (an object, or its JSON text); the output is one JSON value that
  validates against it;
* ``json_object``: true; the output is any JSON object (OpenAI's ``json_object`` mode);
* ``regex``: a regular expression the whole output matches;
* ``choice``: a list of strings; the output is exactly one of them;
* ``grammar``: an EBNF grammar (xgrammar's / GBNF dialect, ``root ::= ...``);
* ``structural_tag``: an xgrammar structural tag (its JSON text or object,
  ``{"type": "structural_tag", "format": {...}}``): tagged regions such as
  ``<tool_call>{...}</tool_call>`` whose contents follow JSON Schemas, optionally triggered
  inside free text. Tool calls (eclectus.protocol.tools) are built on it.

``disable_any_whitespace`` (vLLM's too) keeps the json kinds compact: no whitespace between
JSON tokens.

Validated at the edge (the schema is a JSON object, the regex compiles...); the engine
compiles the grammar once per distinct constraint (:attr:`StructuredOutputs.key`). Frozen
and hashable: the schema is kept as compact JSON text.
"""

from __future__ import annotations

import json as _json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_CHOICES = 1024
MAX_CONSTRAINT_CHARS = 1 << 20  # a schema/regex/grammar of up to 1 MiB of text

_KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


class StructuredOutputs(BaseModel):
    """Exactly one constraint on an output's text (see the module docstring)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True
    )

    # ``json`` on the wire (vLLM's name); a Python attribute of that name would shadow
    # BaseModel.json, hence the alias
    json_schema: str | None = Field(default=None, alias="json", max_length=MAX_CONSTRAINT_CHARS)
    json_object: bool | None = None
    regex: str | None = Field(default=None, max_length=MAX_CONSTRAINT_CHARS)
    choice: tuple[str, ...] | None = Field(default=None, min_length=1, max_length=MAX_CHOICES)
    grammar: str | None = Field(default=None, max_length=MAX_CONSTRAINT_CHARS)
    structural_tag: str | None = Field(default=None, max_length=MAX_CONSTRAINT_CHARS)
    disable_any_whitespace: bool = False  # json kinds: no whitespace between tokens (vLLM)

    @field_validator("json_schema", mode="before")
    @classmethod
    def _schema_text(cls, value: object) -> object:
        """A schema given as an object becomes its canonical JSON text (hashable, one key
        per schema); given as text, it must parse to an object."""
        if isinstance(value, dict):
            return _canonical(value)
        if isinstance(value, str):
            try:
                parsed = _json.loads(value)
            except ValueError as exc:
                raise ValueError(f"json: not valid JSON ({exc})") from None
            if not isinstance(parsed, dict):
                raise ValueError("json: a JSON Schema is a JSON object")
            return _canonical(parsed)
        if isinstance(value, type) and hasattr(value, "model_json_schema"):
            return _canonical(value.model_json_schema())
        return value

    @field_validator("structural_tag", mode="before")
    @classmethod
    def _tag_text(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                value = _json.loads(value)
            except ValueError as exc:
                raise ValueError(f"structural_tag: not valid JSON ({exc})") from None
        if isinstance(value, dict):
            if value.get("type") != "structural_tag" or not isinstance(value.get("format"), dict):
                raise ValueError(
                    'structural_tag: an object {"type": "structural_tag", "format": {...}}'
                )
            return _canonical(value)
        return value

    @field_validator("json_object")
    @classmethod
    def _json_object_true(cls, value: bool | None) -> bool | None:
        if value is False:
            raise ValueError("json_object: only true is meaningful (leave it out otherwise)")
        return value

    @field_validator("regex")
    @classmethod
    def _regex_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"regex: does not compile ({exc})") from None
        return value

    @field_validator("choice", mode="before")
    @classmethod
    def _choice_list(cls, value: object) -> object:
        if isinstance(value, str):
            raise ValueError("choice: a list of strings, not one string")
        return value

    @field_validator("choice")
    @classmethod
    def _choices_nonempty(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and any(not c for c in value):
            raise ValueError("choice: a choice must not be empty")
        return value

    @field_validator("grammar")
    @classmethod
    def _grammar_nonempty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("grammar: empty")
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        named = [k for k in _KINDS if getattr(self, _attr(k)) is not None]
        if len(named) != 1:
            got = ", ".join(named) or "none"
            raise ValueError(f"exactly one of {', '.join(_KINDS)} is needed (got {got})")
        return self

    @property
    def kind(self) -> str:
        """Which constraint this is: "json", "json_object", "regex", "choice" or "grammar"."""
        return next(k for k in _KINDS if getattr(self, _attr(k)) is not None)

    @property
    def schema_object(self) -> dict[str, Any] | None:
        """The JSON Schema as an object (a fresh copy), or None for the other kinds."""
        return None if self.json_schema is None else _json.loads(self.json_schema)

    @property
    def key(self) -> tuple[str, str]:
        """(kind, canonical text): equal constraints compile to the same grammar."""
        kind = self.kind
        value = getattr(self, _attr(kind))
        if kind == "choice":
            return kind, _json.dumps(list(value))
        return kind, value if isinstance(value, str) else ""


def _canonical(schema: dict[str, Any]) -> str:
    """Compact JSON text of a schema. Keys keep their order: the order of ``properties`` is
    the order the output writes them in."""
    return _json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def _attr(kind: str) -> str:
    return "json_schema" if kind == "json" else kind
