"""The docs as a new user meets them: every fenced ```python block of README.md and
docs/*.md runs as printed against a real `tiny` server, and every relative link resolves.

A block that is not meant to run (an API outline, a signature, a fragment, one that needs a
local checkpoint) carries ``<!-- no-run: REASON -->`` on the line before its fence; every
other block runs in its own ``python`` process, in an empty folder, with nothing changed but
the server URL: the SDK's DEFAULT_URL (``ws://127.0.0.1:8765``, where ``eclectus serve``
listens by default) becomes the test server's, and ECLECTUS_URL points there for the
adapters that read it.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from eclectus.adapters.client import DEFAULT_URL
from eclectus.server.config import ServerConfig
from eclectus.server.engine import AsyncEngine
from eclectus.server.front.app import EclectusServer, serve_in_thread

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
NO_RUN = re.compile(r"<!--\s*no-run:(.*?)-->\s*\Z", re.DOTALL)
ANY_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@dataclass(frozen=True, slots=True)
class Snippet:
    """One ```python block: where it is, its code, and why it does not run (None: it runs)."""

    path: Path
    line: int
    code: str
    no_run: str | None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def find_snippets(path: Path) -> list[Snippet]:
    """The ```python blocks of one markdown file, in order (pure but for reading it)."""
    text = path.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip()
        marker = NO_RUN.search(before)
        line = text.count("\n", 0, match.start()) + 1
        reason = marker.group(1).strip() if marker else None
        found.append(Snippet(path, line, match.group(1), reason))
    return found


SNIPPETS = [s for path in DOCS for s in find_snippets(path)]
RUNNABLE = [s for s in SNIPPETS if s.no_run is None]


@pytest.fixture(scope="module")
def server() -> Iterator[EclectusServer]:
    """`eclectus serve --model tiny --budget-guarantee` on a free port, for the module: the
    snippets' JSON replies and tool calls must parse at their budgets, and `tiny` writes
    whitespace in them until `max_tokens` without the (opt-in) guarantee."""
    factory = functools.partial(AsyncEngine.from_config, model="tiny", budget_guarantee=True)
    with serve_in_thread(ServerConfig(port=0, model="tiny"), factory) as running:
        yield running


def test_every_block_runs_or_says_why_not() -> None:
    """Every block either runs (below, one test each) or has a no-run marker with a reason;
    there are blocks of both kinds, and a marker always sits right above a ```python fence."""
    assert RUNNABLE and len(RUNNABLE) < len(SNIPPETS)
    for snippet in SNIPPETS:
        assert snippet.no_run is None or snippet.no_run, f"{snippet.name}: no-run needs a reason"
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        markers = len(re.findall(r"<!--\s*no-run:", text))
        assert markers == sum(s.no_run is not None for s in find_snippets(path)), path


@pytest.mark.slow
@pytest.mark.parametrize("snippet", RUNNABLE, ids=[s.name for s in RUNNABLE])
def test_snippet_runs_as_printed(snippet: Snippet, server: EclectusServer, tmp_path: Path) -> None:
    """The block, as printed, exits 0 in a fresh interpreter against the test server."""
    code = snippet.code.replace(DEFAULT_URL, server.url)
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "ECLECTUS_URL": server.url}
    env.pop("ECLECTUS_TOKEN", None)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{snippet.name} failed:\n{done.stderr[-3000:]}"


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading (pure)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings (code blocks skipped)."""
    text = ANY_FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.MULTILINE)}


def relative_links(path: Path) -> Iterator[str]:
    text = ANY_FENCE.sub("", path.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    for match in LINK.finditer(text):
        target = match.group(1)
        if not re.match(r"[a-z]+:", target):
            yield target


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_relative_links_resolve(path: Path) -> None:
    """Every relative link names a file of the repository, and its #anchor a heading."""
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        missing = not resolved.exists() or not resolved.is_relative_to(ROOT)
        if missing or (anchor and resolved.suffix == ".md" and anchor not in anchors(resolved)):
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: broken links {broken}"
