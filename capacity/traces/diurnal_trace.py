"""A synthetic "bursty diurnal" trace, for the autoscaler evaluation.

A service's load follows the day (users wake, work and sleep), and on top of that swell come
bursts the swell does not predict: a launch, a batch job, a retry storm. A policy that tracks
the swell well can still be caught by a burst, and one that reacts to bursts must not mistake
the swell's slow climb for one. Shape, all seeded:

* Swell: `base_rps` * (1 - `amplitude` * cos(2 pi t / `period_s`)), held constant within
  `segment_s` steps; the mean rate over a whole period is `base_rps`. The default period is the
  trace's duration, so the trace opens and closes at the trough (night) and peaks half-way.
* Bursts: `bursts` times the swell is multiplied by a factor drawn uniformly from
  [`burst_min_factor`, `burst_max_factor`] for a time drawn uniformly from [`burst_min_s`,
  `burst_max_s`]; each lies in its own equal share of the trace at a seeded point, as in
  capacity/traces/burst_trace.py, so bursts never overlap.
* Arrivals: a gamma renewal process per segment, `gap_cv` > 1 for clumping.
* Lengths: `mix` "chat" by default, or "prompt-heavy" (capacity/traces/lulls_trace.py's `LENGTH_MIXES`),
  with `prompt_tokens` / `output_tokens` overriding the means.

Pure: the same spec and seed give the same arrivals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.capacity.traces.segments import MixedLengths, Segments, modulated_schedule, schedule_arrivals


@dataclass(frozen=True)
class DiurnalTraceSpec(MixedLengths):
    duration_s: float = 3600.0
    base_rps: float = 4.0  # the swell's mean
    amplitude: float = 0.5  # relative: the swell runs from base*(1-a) to base*(1+a)
    period_s: float | None = None  # None: the trace's duration
    segment_s: float = 60.0
    bursts: int = 4
    burst_min_s: float = 120.0
    burst_max_s: float = 420.0
    burst_min_factor: float = 2.0
    burst_max_factor: float = 4.0
    gap_cv: float = 1.2  # gamma CV of inter-arrival gaps inside a segment
    mix: str = "chat"
    prompt_tokens: float | None = None
    output_tokens: float | None = None

    def __post_init__(self) -> None:
        problems = []
        for name in ("duration_s", "base_rps", "segment_s", "burst_min_s", "gap_cv"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0")
        if self.period_s is not None and not self.period_s > 0:
            problems.append("period_s must be > 0")
        if not 0 <= self.amplitude <= 1:
            problems.append("amplitude must be in [0, 1]")
        if not self.burst_max_s >= self.burst_min_s:
            problems.append("burst_max_s must be >= burst_min_s")
        if not 1 <= self.burst_min_factor <= self.burst_max_factor:
            problems.append("burst_min_factor and burst_max_factor must satisfy "
                            "1 <= burst_min_factor <= burst_max_factor")
        if self.bursts < 0:
            problems.append("bursts must be >= 0")
        elif self.bursts and self.burst_max_s > self.duration_s / self.bursts:
            problems.append(f"{self.bursts} bursts of up to {self.burst_max_s:g} s do not fit "
                            f"in {self.duration_s:g} s")
        problems += self.length_problems()
        if problems:
            raise ValueError("; ".join(problems))


def diurnal_bursts(spec: DiurnalTraceSpec, seed: int) -> tuple[tuple[float, float, float], ...]:
    """(start_s, end_s, factor) per burst, each inside its own equal share of the trace."""
    rng = np.random.default_rng(seed)
    share = spec.duration_s / spec.bursts if spec.bursts else spec.duration_s
    out = []
    for i in range(spec.bursts):
        length = float(rng.uniform(spec.burst_min_s, spec.burst_max_s))
        start = i * share + float(rng.uniform(0.0, share - length))
        out.append((start, start + length,
                    float(rng.uniform(spec.burst_min_factor, spec.burst_max_factor))))
    return tuple(out)


def diurnal_schedule(spec: DiurnalTraceSpec, seed: int) -> Segments:
    """(start_s, end_s, rps) segments covering [0, duration_s): the swell's steps, cut at each
    burst's start and end."""
    # The bursts as levels of a step function covering the trace (factor 1 between them).
    levels, at = [], 0.0
    for start, end, factor in diurnal_bursts(spec, seed):
        if start > at:
            levels.append((at, start, spec.base_rps))
        levels.append((start, end, spec.base_rps * factor))
        at = end
    if at < spec.duration_s:
        levels.append((at, spec.duration_s, spec.base_rps))
    a, period = spec.amplitude, spec.period_s or spec.duration_s
    return modulated_schedule(levels, spec.segment_s,
                              lambda t: 1.0 - a * math.cos(2.0 * math.pi * t / period))


def diurnal_arrivals(spec: DiurnalTraceSpec = DiurnalTraceSpec(), seed: int = 0) -> Arrivals:
    return schedule_arrivals(diurnal_schedule(spec, seed), spec.gap_cv, spec.lengths, seed)
