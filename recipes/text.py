"""Documents for the recipes: the bundled samples, ``--input`` files, and chunking.

Lengths are measured in *estimated tokens*: UTF-8 bytes, an over-estimate of roughly 4x for
subword tokenizers, the built-in ``tiny``'s BPE included (a chunk of "1024 tokens" is then
about 250 real tokens). The app splits on its
own, as a LangChain app with a text splitter would, so both modes send identical prompts.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

DATA = resources.files("eclectus.recipes").joinpath("data")  # package data (pyproject)


def approx_tokens(text: str) -> int:
    """Estimated tokens of ``text``: its UTF-8 byte count (pure)."""
    return len(text.encode())


def sample_names() -> list[str]:
    """Names of the bundled sample documents (without the .md suffix), sorted."""
    return sorted(p.name.removesuffix(".md") for p in DATA.iterdir() if p.name.endswith(".md"))


def load_sample(name: str) -> str:
    """A bundled sample document's text; raises ValueError for an unknown name."""
    if name not in sample_names():
        raise ValueError(f"no sample {name!r}; choose from {', '.join(sample_names())}")
    return DATA.joinpath(f"{name}.md").read_text(encoding="utf-8")


def load_input(path: str | Path) -> str:
    """A plain-text or markdown file's text (the ``--input`` flag)."""
    return Path(path).read_text(encoding="utf-8")


def check_num_chunks(num_chunks: int | None) -> None:
    """ValueError unless ``num_chunks`` is None (the whole document) or >= 1 (pure)."""
    if num_chunks is not None and num_chunks < 1:
        raise ValueError(f"num_chunks must be >= 1 (or none: the whole document), got {num_chunks}")


def split_chunks(text: str, chunk_tokens: int, num_chunks: int | None = None) -> list[str]:
    """Consecutive chunks of at most ``chunk_tokens`` estimated tokens, cut at paragraph,
    then sentence, then word boundaries where one fits; the first ``num_chunks`` (all when
    None). Raises ValueError when the text gives fewer chunks than asked for. Pure."""
    if chunk_tokens < 8:
        raise ValueError(f"chunk_tokens must be >= 8, got {chunk_tokens}")
    chunks: list[str] = []
    rest = " ".join(text.split())  # one space between words: chunk sizes don't hinge on layout
    while rest and (num_chunks is None or len(chunks) < num_chunks):
        head = _cut(rest, chunk_tokens)
        chunks.append(head.strip())
        rest = rest[len(head) :].lstrip()
    if num_chunks is not None and len(chunks) < num_chunks:
        raise ValueError(
            f"the text gives {len(chunks)} chunks of {chunk_tokens} tokens, not {num_chunks}"
        )
    return chunks


def _cut(text: str, max_tokens: int) -> str:
    """The longest prefix of ``text`` within ``max_tokens`` that ends at a sentence or word
    boundary (a hard cut only for a single over-long word). Pure."""
    if approx_tokens(text) <= max_tokens:
        return text
    window = text.encode()[:max_tokens].decode(errors="ignore")
    for pattern in (r"[.!?]\s", r"\s"):
        ends = [m.end() for m in re.finditer(pattern, window)]
        if ends and ends[-1] > len(window) // 2:
            return window[: ends[-1]]
    return window
