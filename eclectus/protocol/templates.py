"""``{{name}}`` templates: the compact form of a call's prompt, turned into segments.

Shared by the SDK (which checks a template before sending it) and the server (which parses
the ``template`` form of a call), so both reject the same templates with the same message.
"""

from __future__ import annotations

import re

from eclectus.protocol.frames import GenSegment, Segment, TextSegment, VarSegment
from eclectus.protocol.sampling import SamplingParams

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


class TemplateError(ValueError):
    """A template's placeholders are malformed; the message names the problem."""


def template_placeholders(template: str) -> list[str]:
    """The placeholder names of ``template`` in order; raises TemplateError when braces are
    unbalanced, a placeholder is not an identifier, or a name appears twice."""
    names: list[str] = []
    rest = _PLACEHOLDER.sub("", template)
    if "{{" in rest or "}}" in rest:
        bad = rest[max(0, rest.find("{{" if "{{" in rest else "}}") - 10) :][:40]
        raise TemplateError(f"unbalanced or malformed placeholder near {bad!r}")
    for match in _PLACEHOLDER.finditer(template):
        name = match.group(1)
        if name in names:
            raise TemplateError(f"placeholder {{{{{name}}}}} appears twice")
        names.append(name)
    return names


def parse_template(
    template: str, bind: dict[str, str], sampling: dict[str, SamplingParams]
) -> list[Segment]:
    """Turn a ``{{name}}`` template into segments. Every placeholder must be bound to a
    variable id; those with a sampling spec are outputs (GenSegment), the rest inputs."""
    names = template_placeholders(template)
    for name in names:
        if name not in bind:
            raise TemplateError(f"placeholder {{{{{name}}}}} is not bound to a variable")
    for name in [*bind, *sampling]:
        if name not in names:
            raise TemplateError(f"{name!r} is not a placeholder of the template")
    segments: list[Segment] = []
    pos = 0
    for match in _PLACEHOLDER.finditer(template):
        if match.start() > pos:
            segments.append(TextSegment(text=template[pos : match.start()]))
        name = match.group(1)
        if name in sampling:
            segments.append(GenSegment(gen=bind[name], sampling=sampling[name]))
        else:
            segments.append(VarSegment(var=bind[name]))
        pos = match.end()
    if pos < len(template):
        segments.append(TextSegment(text=template[pos:]))
    return segments
