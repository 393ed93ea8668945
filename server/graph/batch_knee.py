"""The batch an engine needs: learned from its own decode steps (``--max-engine-seqs auto``).

Why. An engine's decode step takes longer the more sequences share it: roughly
``t(b) = t0 + c * b``, a fixed cost (scheduling, sampling, launching) plus a cost per
sequence. Its throughput ``b / t(b)`` grows with the batch and levels off at ``1 / c``; past
the knee a bigger batch only slows every request beside it. Where the knee lies depends on
the machine: on the fast 2-core CPU ``tiny``'s throughput levelled off near 16 sequences,
on the slow one a cap of 16 held back the throughput the load needed (docs/benchmarks.md,
"Sessions 5-6"). So the cap is measured, not configured:

- every finished request gives one sample: its decode time per token, the mean number of
  requests in flight per engine while it decoded (the time integral of the in-flight count
  over its decode, divided by the time), and the prompt tokens other requests brought to
  prefill per engine per decode step meanwhile (an engine that chunks prefill into its
  decode steps, as vLLM does, spends those steps on the arrivals' prompts too);
- an exponentially weighted least-squares fit ``t = t0 + c * b + p * q`` through the samples
  gives ``t0`` and ``c`` with the prefill's share ``p * q`` apart: under load the arrivals'
  prompts grow with the batch, and a fit of the batch alone would charge their cost to it;
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
    prefill: float
    num_tokens: int


@dataclass(frozen=True, slots=True)
class StepFit:
    """The fitted step time ``t0 + c * b + p * q`` (seconds; ``q``: prompt tokens prefilled
    per step) and the samples' weight behind it."""

    t0: float
    c: float
    p: float
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
        self._prefill = 0.0  # prompt tokens prefilled so far, per engine
        self._num_engines = 1
        # the weighted sums of the fit over x (batch), z (prefill per step), y (step time)
        self._sums = dict.fromkeys(("w", "x", "z", "y", "xx", "zz", "xz", "xy", "zy"), 0.0)
        # the fit changes only with a sample, but the cap is asked on every dispatch
        self._fit: StepFit | None = None
        self._fit_stale = True

    # -- the in-flight integral ----------------------------------------------------------

    def set_inflight(self, num_inflight: int, num_engines: int = 1) -> None:
        """The scheduler's in-flight count changed (mutates: the integral)."""
        now = self._clock()
        self._area += (now - self._since) * self._inflight / self._num_engines
        self._since = now
        self._inflight = num_inflight
        self._num_engines = max(num_engines, 1)

    def add_prefill(self, num_tokens: int) -> None:
        """A request's prompt was prefilled (its first token came) (mutates)."""
        self._prefill += num_tokens / self._num_engines

    def _area_now(self) -> tuple[float, float]:
        now = self._clock()
        return now, self._area + (now - self._since) * self._inflight / self._num_engines

    # -- samples -------------------------------------------------------------------------

    def mark(self, num_tokens: int) -> DecodeMark:
        """A request's first tokens arrived: its decode starts now (pure)."""
        now, area = self._area_now()
        return DecodeMark(now, area, self._prefill, num_tokens)

    def finish(self, mark: DecodeMark, num_tokens: int) -> None:
        """The request finished with ``num_tokens`` in all (mutates: one sample, where it
        decoded at least one token after ``mark``)."""
        steps = num_tokens - mark.num_tokens
        now, area = self._area_now()
        elapsed = now - mark.at
        if steps < 1 or elapsed <= 0:
            return
        prefill = (self._prefill - mark.prefill) / steps
        self.add(batch=(area - mark.area) / elapsed, step_s=elapsed / steps, prefill=prefill)

    def add(self, *, batch: float, step_s: float, prefill: float = 0.0) -> None:
        """One sample: a decode at a mean ``batch``, beside ``prefill`` prompt tokens per
        step, took ``step_s`` per token (mutates)."""
        x, z, y = batch, prefill, step_s
        terms = {"w": 1.0, "x": x, "z": z, "y": y, "xx": x * x, "zz": z * z, "xz": x * z,
                 "xy": x * y, "zy": z * y}  # fmt: skip
        for key, value in terms.items():
            self._sums[key] = self._sums[key] * self._decay + value
        self._fit_stale = True

    @property
    def weight(self) -> float:
        """The samples' total weight (pure)."""
        return self._sums["w"]

    # -- the fit and the cap -------------------------------------------------------------

    def fit(self) -> StepFit | None:
        """The step-time fit, or None while the samples are too few or their batches too
        alike (pure). Where the prefill per step does not vary apart from the batch, its cost
        stays in ``t0`` (a plain line over the batch)."""
        if self._fit_stale:
            self._fit, self._fit_stale = self._solve(), False
        return self._fit

    def _solve(self) -> StepFit | None:
        s = self._sums
        w = s["w"]
        if w < self.min_weight:
            return None
        mx, mz, my = s["x"] / w, s["z"] / w, s["y"] / w
        vxx, vzz = s["xx"] / w - mx * mx, s["zz"] / w - mz * mz
        vxz, vxy, vzy = s["xz"] / w - mx * mz, s["xy"] / w - mx * my, s["zy"] / w - mz * my
        if vxx < self.min_spread**2:
            return None
        det = vxx * vzz - vxz * vxz
        if det > 1e-9 * vxx * vzz and vzz > 0:
            p = (vzy * vxx - vxy * vxz) / det
            if p >= 0:  # a prefill that costs time, as it does (below zero: noise)
                c = (vxy * vzz - vzy * vxz) / det
                return StepFit(t0=my - c * mx - p * mz, c=c, p=p, weight=w)
        c = vxy / vxx  # no prefill seen apart from the batch: a line over the batch
        return StepFit(t0=my - c * mx, c=c, p=0.0, weight=w)

    def cap(self, ceiling: int) -> int:
        """Requests to admit per engine, at most ``ceiling`` (its own batch) (pure)."""
        fit = self.fit()
        if fit is None or fit.c <= 0:
            return ceiling  # nothing learned yet, or no cost per sequence seen
        if fit.t0 <= 0:
            return min(self.min_cap, ceiling)  # all cost is per sequence: batching gains nothing
        knee = self.fraction * fit.t0 / (fit.c * (1.0 - self.fraction))
        return max(min(math.ceil(knee), ceiling), min(self.min_cap, ceiling))
