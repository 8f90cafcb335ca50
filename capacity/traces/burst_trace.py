"""A synthetic trace with sharp bursts, for the autoscaler evaluation.

The rate is a step function: `base_rps`, jumping to `burst_rps` for `burst_s` seconds,
`bursts` times. The steps are instant because that is the case a cold-start-aware policy exists
for: a replica takes minutes to start, a burst takes a second to arrive. Each burst starts at a
seeded random point of its own equal share of the trace, so bursts never overlap and the gaps
between them vary. Within each constant-rate segment arrivals are a gamma renewal process
(`capacity.arrivals.gamma_arrivals`: cv 1 is Poisson) with log-normal prompt and output lengths.

Pure and seeded: the same spec and seed give the same arrivals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hbmserve.capacity.traces.arrivals import Arrivals, gamma_arrivals


@dataclass(frozen=True)
class BurstSpec:
    duration_s: float = 3600.0
    base_rps: float = 5.0
    burst_rps: float = 25.0
    bursts: int = 4
    burst_s: float = 300.0
    gap_cv: float = 1.0  # gamma CV of inter-arrival gaps inside a segment
    prompt_tokens: float = 1000.0  # means; the Azure conversation trace's are ~1150 and ~210
    output_tokens: float = 200.0
    length_cv: float = 0.8

    def __post_init__(self) -> None:
        problems = []
        for name in ("duration_s", "base_rps", "burst_rps", "burst_s", "gap_cv",
                     "prompt_tokens", "output_tokens"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0")
        if self.bursts < 0:
            problems.append("bursts must be >= 0")
        elif self.bursts and self.burst_s > self.duration_s / self.bursts:
            problems.append(f"{self.bursts} bursts of {self.burst_s:g} s do not fit in "
                            f"{self.duration_s:g} s")
        if self.length_cv < 0:
            problems.append("length_cv must be >= 0")
        if problems:
            raise ValueError("; ".join(problems))


def burst_schedule(spec: BurstSpec, seed: int) -> tuple[tuple[float, float, float], ...]:
    """(start_s, end_s, rps) segments covering [0, duration_s)."""
    rng = np.random.default_rng(seed)
    slot = spec.duration_s / spec.bursts if spec.bursts else spec.duration_s
    segments: list[tuple[float, float, float]] = []
    at = 0.0
    for i in range(spec.bursts):
        start = i * slot + float(rng.uniform(0.0, slot - spec.burst_s))
        if start > at:
            segments.append((at, start, spec.base_rps))
        segments.append((start, start + spec.burst_s, spec.burst_rps))
        at = start + spec.burst_s
    if at < spec.duration_s:
        segments.append((at, spec.duration_s, spec.base_rps))
    return tuple(segments)


def burst_arrivals(spec: BurstSpec, seed: int = 0) -> Arrivals:
    segments = burst_schedule(spec, seed)
    # One independent stream per segment, derived from the seed so segments do not share draws.
    seeds = np.random.SeedSequence(seed).generate_state(len(segments))
    parts = [gamma_arrivals(rps, end - start, spec.gap_cv, spec.prompt_tokens, spec.output_tokens,
                            spec.length_cv, int(s))
             for (start, end, rps), s in zip(segments, seeds)]
    t = np.concatenate([p.t + start for p, (start, _, _) in zip(parts, segments)])
    return Arrivals(t, np.concatenate([p.prompt for p in parts]),
                    np.concatenate([p.output for p in parts]))
