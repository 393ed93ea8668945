"""idle_within: the seconds of a run in which its engine had none of its calls."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eclectus.evals.trace import idle_within


def test_idle_is_what_no_span_covers() -> None:
    """Gaps before, between and after calls count; overlaps count once; spans past the
    run's end are clipped."""
    spans = [(0.1, 0.4), (0.2, 0.5), (0.7, 0.9), (0.95, 1.5)]
    assert idle_within(spans, 1.0) == pytest.approx(0.1 + 0.2 + 0.05)
    assert idle_within([], 2.0) == 2.0


span = st.tuples(st.floats(0, 10), st.floats(0, 10)).map(lambda p: (min(p), max(p)))


@given(st.lists(span, max_size=20), st.floats(0, 12))
def test_idle_is_between_none_and_the_whole_run(
    spans: list[tuple[float, float]], total: float
) -> None:
    idle = idle_within(spans, total)
    assert 0.0 <= idle <= total + 1e-9
    longest = max((min(e, total) - min(s, total) for s, e in spans), default=0.0)
    assert idle <= total - longest + 1e-9  # one call alone already covers its span
