"""How each engine family spells a structured-output constraint on ``/v1/completions``.

Eclectus renders prompts (tools included, through the chat template) and sends token ids, so
every engine sees a completion; the constraint (``SamplingParams.structured_outputs``: a
JSON schema, any JSON object, a regex, a choice list, an EBNF grammar, or the structural
tag a tool call is built on) must travel in the engine's own request fields:

``vllm``         vLLM >= 0.10 (and Eclectus): ``structured_outputs: {json | json_object |
                 regex | choice | grammar | structural_tag, disable_any_whitespace}``
``sglang``       SGLang: ``json_schema`` (JSON text), ``regex``, ``ebnf``; ``json_object``
                 and ``structural_tag`` through ``response_format``; a choice list becomes
                 the regex of its alternatives
``vllm-guided``  vLLM < 0.10: ``guided_json``, ``guided_regex``, ``guided_choice``,
                 ``guided_grammar``; ``json_object`` through ``response_format``; no
                 structural tag in the format Eclectus's tool calls use
``none``         the engine was not seen to enforce any of these: constrained calls are not
                 sent to it

All three families ignore request fields they do not know (vLLM logs them, SGLang drops
them silently), so the dialect is found by behaviour, never by acceptance: the handshake
sends a one-choice constraint in each dialect and keeps the first whose answer is exactly
that choice (:func:`probe_choice`). A constraint a dialect cannot express raises
:class:`Unenforceable`: a constrained call is never decoded unconstrained.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Any

from eclectus.protocol.structured import StructuredOutputs

# the one-choice probe: a text no model writes by chance in so few tokens
PROBE_CHOICE = "Eclectus-choice-probe 7"


_META = re.compile(r"[\\.^$|?*+()\[\]{}]")


class Dialect(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    VLLM_GUIDED = "vllm-guided"
    NONE = "none"


# the order the handshake tries them in: the current vLLM field first (Eclectus serves it)
PROBE_ORDER = (Dialect.VLLM, Dialect.SGLANG, Dialect.VLLM_GUIDED)


class Unenforceable(ValueError):
    """The engine's dialect has no field for this constraint."""


def constraint_fields(dialect: Dialect, constraint: StructuredOutputs) -> dict[str, Any]:
    """The request fields that make an engine of ``dialect`` enforce ``constraint`` (pure).
    Raises Unenforceable when it cannot."""
    if dialect is Dialect.VLLM:
        return {"structured_outputs": _vllm(constraint)}
    if dialect is Dialect.SGLANG:
        return _sglang(constraint)
    if dialect is Dialect.VLLM_GUIDED:
        return _guided(constraint)
    raise Unenforceable("the engine enforces no structured outputs (found at its handshake)")


def supports(dialect: Dialect, constraint: StructuredOutputs | None) -> bool:
    """Whether an engine of ``dialect`` can take a request with ``constraint`` (pure)."""
    if constraint is None:
        return True
    try:
        constraint_fields(dialect, constraint)
    except Unenforceable:
        return False
    return True


def probe_choice() -> StructuredOutputs:
    """The constraint the handshake probes each dialect with."""
    return StructuredOutputs(choice=(PROBE_CHOICE,))


def _vllm(c: StructuredOutputs) -> dict[str, Any]:
    kind = c.kind
    value: Any = {
        "json": c.schema_object,
        "json_object": True,
        "regex": c.regex,
        "choice": list(c.choice or ()),
        "grammar": c.grammar,
        "structural_tag": c.structural_tag,  # vLLM takes the tag as JSON text
    }[kind]
    fields: dict[str, Any] = {kind: value}
    if c.disable_any_whitespace:
        fields["disable_any_whitespace"] = True
    return fields


def _sglang(c: StructuredOutputs) -> dict[str, Any]:
    kind = c.kind
    if kind == "json":
        return {"json_schema": c.json_schema}  # SGLang takes the schema as JSON text
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if kind == "regex":
        return {"regex": c.regex}
    if kind == "choice":
        return {"regex": choice_regex(c.choice or ())}
    if kind == "grammar":
        return {"ebnf": c.grammar}
    # xgrammar's structural tag object, which SGLang's response_format takes as it is
    return {"response_format": json.loads(c.structural_tag or "{}")}


def _guided(c: StructuredOutputs) -> dict[str, Any]:
    kind = c.kind
    if kind == "json":
        return {"guided_json": c.schema_object}
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if kind == "regex":
        return {"guided_regex": c.regex}
    if kind == "choice":
        return {"guided_choice": list(c.choice or ())}
    if kind == "grammar":
        return {"guided_grammar": c.grammar}
    raise Unenforceable(
        "vLLM < 0.10 takes no structural tag in this format (tool calls need vLLM >= 0.10)"
    )


def choice_regex(choices: tuple[str, ...]) -> str:
    """A regex matching exactly one of ``choices`` (pure): each escaped, alternated. Only
    the metacharacters are escaped (``re.escape`` also escapes spaces and ``-``, which not
    every engine's regex dialect takes)."""
    return "(" + "|".join(_META.sub(r"\\\g<0>", choice) for choice in choices) + ")"
