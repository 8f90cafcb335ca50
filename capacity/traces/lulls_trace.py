"""A synthetic "lulls and bursts" trace: a two-state Markov-modulated arrival process, for the
autoscaler evaluation.

Production LLM traffic (the Azure and Mooncake traces, BurstGPT) is neither Poisson nor a tidy
step: it alternates quiet stretches and busy ones whose lengths vary by an order of magnitude, and
a long lull is what tempts a policy to scale in just before the next burst. Each knob models one
part of that structure:

* States: the rate alternates between `lull_rps` and `burst_rps`. With the defaults the
  long-run mean is about 4 req/s, a burst 2.5x that, and the busiest 30 s of an hour, with the
  jitter and the gap clumping, 3-6x the hour's mean (seeds 0-7). The first state is drawn with
  its long-run share of time, so a trace does not always open quiet.
* Sojourns: each lull and each burst lasts a log-normal time with mean `lull_s` / `burst_s` and
  coefficient of variation `sojourn_cv`, clipped to [`min_sojourn_s`, `max_sojourn_s`]. A cv
  above 1 is the heavy tail (an exponential sojourn, a plain Markov chain, has cv 1): most
  sojourns are short, a few are long enough to span a scaling decision's whole horizon. The
  clip keeps a sojourn above the policy's decision interval and below half an hour-long trace.
* Burst height: each burst's rate is `burst_rps` times a log-normal factor of mean 1 and cv
  `burst_jitter`; no two bursts ask for the same fleet.
* Diurnal drift: both rates are multiplied by 1 + `diurnal_amplitude` * sin(2 pi t /
  `diurnal_period_s`), held constant within `segment_s` steps. The default period is a day, so
  over an hour the drift is slow; a shorter period compresses a day into the trace.
* Arrivals: a gamma renewal process per segment, `gap_cv` > 1 for the clumping within a state.
* Lengths: `mix` "prompt-heavy" (code completion: long prompts, a few dozen output tokens) or
  "chat" (conversation: shorter prompts, a few hundred output tokens), log-normal, with
  `prompt_tokens` / `output_tokens` overriding the mix's means.

Pure and seeded: the same spec and seed give the same arrivals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.capacity.traces.segments import MixedLengths, Segments, modulated_schedule, schedule_arrivals

@dataclass(frozen=True)
class LullsTraceSpec(MixedLengths):
    duration_s: float = 3600.0
    lull_rps: float = 1.0
    burst_rps: float = 10.0
    lull_s: float = 180.0  # mean sojourns, before the clip
    burst_s: float = 90.0
    sojourn_cv: float = 1.5
    min_sojourn_s: float = 15.0
    max_sojourn_s: float = 1800.0
    burst_jitter: float = 0.3  # cv of each burst's height factor (mean 1)
    diurnal_amplitude: float = 0.0
    diurnal_period_s: float = 86400.0
    segment_s: float = 60.0  # the drift's step; unused when diurnal_amplitude is 0
    gap_cv: float = 1.2  # gamma CV of inter-arrival gaps inside a segment
    mix: str = "prompt-heavy"
    prompt_tokens: float | None = None
    output_tokens: float | None = None

    def __post_init__(self) -> None:
        problems = []
        for name in ("duration_s", "lull_rps", "burst_rps", "lull_s", "burst_s", "min_sojourn_s",
                     "diurnal_period_s", "segment_s", "gap_cv"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0")
        if not self.burst_rps > self.lull_rps:
            problems.append("burst_rps must be > lull_rps")
        if not self.max_sojourn_s >= self.min_sojourn_s:
            problems.append("max_sojourn_s must be >= min_sojourn_s")
        for name in ("lull_s", "burst_s"):
            if not self.min_sojourn_s <= getattr(self, name) <= self.max_sojourn_s:
                problems.append(f"{name} must lie in [min_sojourn_s, max_sojourn_s] = "
                                f"[{self.min_sojourn_s:g}, {self.max_sojourn_s:g}]")
        for name in ("sojourn_cv", "burst_jitter"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if not 0 <= self.diurnal_amplitude <= 1:
            problems.append("diurnal_amplitude must be in [0, 1]")
        problems += self.length_problems()
        if problems:
            raise ValueError("; ".join(problems))


def _lognormal(rng: np.random.Generator, mean: float, cv: float) -> float:
    if cv <= 0:
        return mean
    sigma2 = math.log(1 + cv * cv)
    return float(rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2)))


def lulls_states(spec: LullsTraceSpec, seed: int) -> Segments:
    """(start_s, end_s, rps) per sojourn, before the diurnal drift: lulls at `lull_rps`, bursts
    at their jittered height, alternating, covering [0, duration_s)."""
    rng = np.random.default_rng(seed)
    burst = bool(rng.random() < spec.burst_s / (spec.lull_s + spec.burst_s))
    out: list[tuple[float, float, float]] = []
    at = 0.0
    while at < spec.duration_s:
        mean = spec.burst_s if burst else spec.lull_s
        stay = min(max(_lognormal(rng, mean, spec.sojourn_cv), spec.min_sojourn_s),
                   spec.max_sojourn_s)
        rps = spec.burst_rps * _lognormal(rng, 1.0, spec.burst_jitter) if burst else spec.lull_rps
        end = min(at + stay, spec.duration_s)
        out.append((at, end, rps))
        at, burst = end, not burst
    return tuple(out)


def lulls_schedule(spec: LullsTraceSpec, seed: int) -> Segments:
    """(start_s, end_s, rps) segments covering [0, duration_s): one per sojourn, cut into
    `segment_s` steps when there is a diurnal drift."""
    states = lulls_states(spec, seed)
    if spec.diurnal_amplitude == 0:
        return states
    a, period = spec.diurnal_amplitude, spec.diurnal_period_s
    return modulated_schedule(states, spec.segment_s,
                              lambda t: max(0.0, 1.0 + a * math.sin(2.0 * math.pi * t / period)))


def lulls_arrivals(spec: LullsTraceSpec = LullsTraceSpec(), seed: int = 0) -> Arrivals:
    return schedule_arrivals(lulls_schedule(spec, seed), spec.gap_cv, spec.lengths, seed)
