"""Where Eclectus keeps what it builds on first use (preset models, compiled CPU kernels)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The root of Eclectus' cache: ``$ECLECTUS_CACHE``, else ``$XDG_CACHE_HOME/eclectus``,
    else ``~/.cache/eclectus`` (pure: reads the environment)."""
    if root := os.environ.get("ECLECTUS_CACHE"):
        return Path(root)
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg) / "eclectus"
    return Path.home() / ".cache" / "eclectus"
