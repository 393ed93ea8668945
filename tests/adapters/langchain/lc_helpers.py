"""Helpers for this package's tests (a module of its own: ``conftest`` is not importable
by name when several test folders have one)."""

from __future__ import annotations

import re
import urllib.request

from eclectus.server.app import EclectusServer


def metric(server: EclectusServer, name: str) -> float:
    """The sum of a metric's samples on GET /metrics (all label sets)."""
    with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(text))
