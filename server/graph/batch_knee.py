"""The batch an engine needs: learned from its own decode steps (``--max-engine-seqs auto``).

Why. An engine's decode step takes longer the more sequences share it: roughly
``t(b) = t0 + c * b``, a fixed cost (scheduling, sampling, launching) plus a cost per
sequence. Its throughput ``b / t(b)`` grows with the batch and levels off at ``1 / c``; past
the knee a bigger batch only slows every request beside it. Where the knee lies depends on
the machine: on the fast 2-core CPU ``tiny``'s throughput levelled off near 16 sequences,
on the slow one a cap of 16 held back the throughput the load needed (docs/benchmarks.md,
"Sessions 5-6"). So the cap is measured, not configured:

- every finished request gives one sample: its decode time per token, and the mean number
  of requests in flight per engine while it decoded (the time integral of the in-flight count
  over its decode, divided by the time);
- an exponentially weighted least-squares line through the samples gives ``t0`` and ``c``;
- the cap is the smallest batch that reaches ``fraction`` of the asymptotic throughput:
  ``b / (t0 + c b) = fraction / c``, that is ``b = fraction * t0 / (c * (1 - fraction))``.

Until the samples span a spread of batch sizes (light load) nothing is known and the
engine's own batch applies: with no queue, the cap does not matter. A flat step time (no
per-sequence cost seen) also leaves the engine's batch; a step time proportional to the batch
(no fixed cost) gains nothing from batching, and the cap falls to ``min_cap``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DecodeMark:
    """Where a request's decode began: the time, the in-flight integral then, and the tokens
    it had by then."""

    at: float
    area: float
    num_tokens: int


@dataclass(frozen=True, slots=True)
class StepFit:
    """The fitted step time ``t0 + c * b`` (seconds) and the samples' weight behind it."""

    t0: float
    c: float
    weight: float


class BatchKnee:
    """Learns one engine's step time against its batch; says the batch at its knee."""

    def __init__(
        self,
        *,
        fraction: float = 0.9,
        min_cap: int = 4,
        memory: float = 200.0,
        min_weight: float = 20.0,
        min_spread: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < fraction < 1:
            raise ValueError(f"fraction must be in (0, 1), got {fraction}")
        self.fraction = fraction
        self.min_cap = min_cap
        self.min_weight = min_weight  # samples (weighted) before the fit is trusted
        self.min_spread = min_spread  # std of the samples' batch sizes before it is
        self._decay = 1.0 - 1.0 / memory  # each sample's weight shrinks so per new sample
        self._clock = clock
        self._inflight = 0
        self._since = clock()
        self._area = 0.0  # time integral of requests in flight, per engine
        self._num_engines = 1
        # the weighted sums of the least-squares fit: weight, x, y, xx, xy
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    # -- the in-flight integral ----------------------------------------------------------

    def set_inflight(self, num_inflight: int, num_engines: int = 1) -> None:
        """The scheduler's in-flight count changed (mutates: the integral)."""
        now = self._clock()
        self._area += (now - self._since) * self._inflight / self._num_engines
        self._since = now
        self._inflight = num_inflight
        self._num_engines = max(num_engines, 1)

    def _area_now(self) -> tuple[float, float]:
        now = self._clock()
        return now, self._area + (now - self._since) * self._inflight / self._num_engines

    # -- samples -------------------------------------------------------------------------

    def mark(self, num_tokens: int) -> DecodeMark:
        """A request's first tokens arrived: its decode starts now (pure)."""
        now, area = self._area_now()
        return DecodeMark(now, area, num_tokens)

    def finish(self, mark: DecodeMark, num_tokens: int) -> None:
        """The request finished with ``num_tokens`` in all (mutates: one sample, where it
        decoded at least one token after ``mark``)."""
        steps = num_tokens - mark.num_tokens
        now, area = self._area_now()
        elapsed = now - mark.at
        if steps < 1 or elapsed <= 0:
            return
        self.add(batch=(area - mark.area) / elapsed, step_s=elapsed / steps)

    def add(self, *, batch: float, step_s: float) -> None:
        """One sample: a decode at a mean ``batch`` took ``step_s`` per token (mutates)."""
        d = self._decay
        self._w = self._w * d + 1.0
        self._x = self._x * d + batch
        self._y = self._y * d + step_s
        self._xx = self._xx * d + batch * batch
        self._xy = self._xy * d + batch * step_s

    # -- the fit and the cap -------------------------------------------------------------

    def fit(self) -> StepFit | None:
        """The step-time line, or None while the samples are too few or too alike (pure)."""
        if self._w < self.min_weight:
            return None
        mean_x, mean_y = self._x / self._w, self._y / self._w
        var_x = self._xx / self._w - mean_x * mean_x
        if var_x < self.min_spread**2:
            return None
        c = (self._xy / self._w - mean_x * mean_y) / var_x
        return StepFit(t0=mean_y - c * mean_x, c=c, weight=self._w)

    def cap(self, ceiling: int) -> int:
        """Requests to admit per engine, at most ``ceiling`` (its own batch) (pure)."""
        fit = self.fit()
        if fit is None or fit.c <= 0:
            return ceiling  # nothing learned yet, or no cost per sequence seen
        if fit.t0 <= 0:
            return min(self.min_cap, ceiling)  # all cost is per sequence: batching gains nothing
        knee = self.fraction * fit.t0 / (fit.c * (1.0 - self.fraction))
        return max(min(math.ceil(knee), ceiling), min(self.min_cap, ceiling))
