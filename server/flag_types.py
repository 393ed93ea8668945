"""The argparse types of ``eclectus serve``'s number flags: each one check (argparse names the
flag in its error, and the command exits 2 with that one line)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Literal, TypeVar

from eclectus.server.checks import in_range
from eclectus.server.engine.engine_config import GiB

T = TypeVar("T", int, float)


def _parsed(text: str, parse: Callable[[str], T], fits: Callable[[T], bool], what: str) -> T:
    """``parse(text)`` when it parses and fits, else argparse's error saying it ``must be
    {what}`` (argparse names the flag). The one shape of every number flag's type."""
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not fits(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return _parsed(text, int, lambda value: value >= 1, "an integer >= 1")


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    return _parsed(text, int, lambda value: value >= 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (seconds, rates, fractions)."""
    return _parsed(text, float, lambda v: in_range(v, 0, inclusive=False), "a number > 0")


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0 (a grace period that may be none, a rate)."""
    return _parsed(text, float, lambda v: in_range(v, 0, inclusive=True), "a number >= 0")


def positive_gib(text: str) -> float:
    """An argparse type: a finite number of GiB > 0 that is at least one byte."""

    def fits(value: float) -> bool:
        return in_range(value, 0, inclusive=False) and round(value * GiB) >= 1

    return _parsed(text, float, fits, "a number of GiB > 0")


def positive_int_or_none(text: str) -> int | None:
    """An argparse type: an integer >= 1, or "none" (no limit)."""
    return None if text.strip().lower() == "none" else positive_int(text)


def engine_seqs(text: str) -> int | Literal["auto"] | None:
    """An argparse type for ``--max-engine-seqs``: an integer >= 1, "none" or "auto"."""
    return "auto" if text.strip().lower() == "auto" else positive_int_or_none(text)


def non_negative_int_or_none(text: str) -> int | None:
    """An argparse type: an integer >= 0, or "none" (no limit)."""
    return None if text.strip().lower() == "none" else non_negative_int(text)
