"""The range check of a real-valued setting, one rule for every config field and CLI flag:
finite (NaN and infinity are no timeout, rate or fraction) and above a bound."""

from __future__ import annotations

import math


def in_range(value: float, minimum: float, *, inclusive: bool) -> bool:
    """Whether ``value`` is finite and > ``minimum`` (>= with ``inclusive``) (pure)."""
    return math.isfinite(value) and (value >= minimum if inclusive else value > minimum)


def require_range(name: str, value: float, minimum: float, *, inclusive: bool) -> None:
    """ValueError naming ``name`` unless :func:`in_range` (pure)."""
    if not in_range(value, minimum, inclusive=inclusive):
        bound = ">=" if inclusive else ">"
        raise ValueError(f"{name} must be {bound} {minimum:g} and finite, got {value}")
