"""Helpers for this package's tests (a module of its own: ``conftest`` is not importable
by name when several test folders have one)."""

from __future__ import annotations

import re
import urllib.request

from eclectus.adapters.langchain import ChatEclectus
from eclectus.server.front.app import EclectusServer


def metric(server: EclectusServer, name: str) -> float:
    """The sum of a metric's samples on GET /metrics (all label sets)."""
    with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(text))


class ChatEclectusFeatures:
    """What ChatEclectus supports, as langchain-tests asks it: one statement for the unit
    and the integration suite (put first among a suite's bases, so these win). Multimodal
    inputs are off: the server generates text."""

    @property
    def chat_model_class(self) -> type[ChatEclectus]:
        return ChatEclectus

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True
