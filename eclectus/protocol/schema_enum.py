"""The string literals a JSON Schema pins a field to: what a switch with a ``path`` routes on.

A reply constrained to a JSON Schema (``structured_outputs.json``) is one JSON value that
validates against it, so when the schema makes the field at ``path`` (object keys, each
property ``required``) an ``enum`` or ``const`` of strings, that field is one of those
literals by construction, exactly like a ``choice``. Used by the server at submit (a switch
on such a field, docs/protocol.md) and by the LangGraph compiler (a ``with_structured_output``
router) so both read a schema the same way. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

MAX_REF_HOPS = 32  # ``$ref`` links followed for one path step (a cycle is refused)


class NotPinned(ValueError):
    """The schema does not pin the path to string literals; the message says where."""


def pinned_literals(schema: dict[str, Any], path: Sequence[str]) -> tuple[str, ...]:
    """The strings the schema allows at ``path``, in the schema's order; NotPinned naming
    the first key that is not a required property of an object, or a field that is not
    an ``enum`` / ``const`` of strings."""
    node = _deref(schema, schema)
    for i, key in enumerate(path):
        where = "/".join(path[:i]) or "the root"
        properties = node.get("properties")
        if not isinstance(properties, dict) or key not in properties:
            raise NotPinned(f"{where} has no property {key!r}")
        if key not in node.get("required", ()):
            raise NotPinned(f"{key!r} is not required at {where}: a reply may leave it out")
        node = _deref(properties[key], schema)
    if "const" in node:
        literals: list[Any] = [node["const"]]
    elif isinstance(node.get("enum"), list) and node["enum"]:
        literals = node["enum"]
    else:
        raise NotPinned(f"{'/'.join(path)} is not pinned to an enum or const of strings")
    if not all(isinstance(v, str) for v in literals):
        raise NotPinned(f"{'/'.join(path)}: an enum of non-strings {literals!r}")
    return tuple(dict.fromkeys(literals))


def field_at(text: str, path: Sequence[str]) -> str | None:
    """The string at ``path`` of the JSON value ``text``; None when it is not valid JSON,
    lacks the field or holds no string there (pure)."""
    try:
        value: Any = json.loads(text)
    except ValueError:
        return None
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, str) else None


def _deref(node: Any, root: dict[str, Any]) -> dict[str, Any]:
    """``node`` with local ``$ref`` links and one-item ``allOf`` wrappers (pydantic's
    forms for an enum class) followed (pure); NotPinned for a link to nothing."""
    for _ in range(MAX_REF_HOPS):
        if not isinstance(node, dict):
            raise NotPinned(f"a schema that is not an object: {node!r}")
        ref = node.get("$ref")
        if isinstance(ref, str):
            node = _pointer(root, ref)
        elif isinstance(node.get("allOf"), list) and len(node["allOf"]) == 1:
            node = node["allOf"][0]
        else:
            return node
    raise NotPinned(f"over {MAX_REF_HOPS} $ref links (a cycle?)")


def _pointer(root: dict[str, Any], ref: str) -> Any:
    if not ref.startswith("#"):
        raise NotPinned(f"$ref {ref!r} is not local to the schema")
    node: Any = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise NotPinned(f"$ref {ref!r} points to nothing")
        node = node[part]
    return node
