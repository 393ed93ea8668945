"""Fresh input for every run, so that no run is served from a prefix cache warmed by another.

A run's document is the sample with its ASCII letters permuted by a bijection drawn from the
run's seed. Lengths, spaces and punctuation are kept, so the recipes cut the same chunks at the
same places (identical token counts with a byte-level tokenizer; a BPE makes more tokens of
permuted words than of the words its merges learned), while the bytes of every chunk, the
shared handbook and every question differ from every other run's from the first letter on.
Prefixes shared *within* a run (the same handbook in every chat, the same design in every
engineer's prompt, the templates) stay shared: that is what the systems are measured on.
"""

from __future__ import annotations

import random
import string


def letter_permutation(seed: int) -> dict[str, str]:
    """A seeded bijection of lower-case letters (upper-case follows it) with no fixed point
    among the first letters a prompt may start with (pure)."""
    rng = random.Random(seed)
    letters = list(string.ascii_lowercase)
    while True:
        shuffled = letters[:]
        rng.shuffle(shuffled)
        if all(a != b for a, b in zip(letters, shuffled, strict=True)):  # a derangement
            return dict(zip(letters, shuffled, strict=True))


def fresh_text(text: str, seed: int) -> str:
    """``text`` with its letters permuted by ``letter_permutation(seed)`` (pure)."""
    lower = letter_permutation(seed)
    table = {ord(a): b for a, b in lower.items()}
    table |= {ord(a.upper()): b.upper() for a, b in lower.items()}
    return text.translate(table)
