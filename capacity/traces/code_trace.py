"""A synthetic prompt-heavy trace, shaped like code completion, for the autoscaler evaluation.

Code completion sends the file around the cursor and asks for a line or two: prompts of about
2,000 tokens, outputs of a few dozen. Such a workload is mostly prefill, which is where a
chunked-prefill engine's decode steps slow down (each step that carries a prompt chunk takes
the chunk's time), so it stresses the TPOT target in a way conversation traces do not.

Shape, all seeded:
* Rate: a working-hours swell from `base_rps` to `peak_rps` and back over the trace (a raised
  cosine), held constant within `segment_s` segments.
* Spikes: `spikes` times, for `spike_s` seconds, the rate is `spike_factor` times the swell
  (a team's editors reopening at once, an agent run); each lies in its own equal share of the
  trace, at a seeded point.
* Arrivals: a gamma renewal process per segment, `gap_cv` > 1 for the keystroke-driven
  clumping of completions.
* Lengths: log-normal, prompts mean `prompt_tokens` (cv `prompt_cv`), outputs mean
  `output_tokens` (cv `output_cv`), drawn independently.

Pure: the same spec and seed give the same arrivals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hbmserve.capacity.traces.arrivals import Arrivals, gamma_arrivals, lognormal_lengths


@dataclass(frozen=True)
class CodeTraceSpec:
    duration_s: float = 3600.0
    base_rps: float = 4.0
    peak_rps: float = 12.0
    segment_s: float = 60.0
    spikes: int = 2
    spike_s: float = 120.0
    spike_factor: float = 1.6
    gap_cv: float = 1.5
    prompt_tokens: float = 2000.0
    prompt_cv: float = 0.5
    output_tokens: float = 32.0
    output_cv: float = 0.8

    def __post_init__(self) -> None:
        problems = []
        for name in ("duration_s", "base_rps", "segment_s", "spike_s", "gap_cv",
                     "prompt_tokens", "output_tokens"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0")
        if self.peak_rps < self.base_rps:
            problems.append("peak_rps must be >= base_rps")
        if self.spike_factor < 1:
            problems.append("spike_factor must be >= 1")
        if self.prompt_cv < 0 or self.output_cv < 0:
            problems.append("prompt_cv and output_cv must be >= 0")
        if self.spikes < 0:
            problems.append("spikes must be >= 0")
        elif self.spikes and self.spike_s > self.duration_s / self.spikes:
            problems.append(f"{self.spikes} spikes of {self.spike_s:g} s do not fit in "
                            f"{self.duration_s:g} s")
        if problems:
            raise ValueError("; ".join(problems))


def code_schedule(spec: CodeTraceSpec, seed: int) -> tuple[tuple[float, float, float], ...]:
    """(start_s, end_s, rps) segments covering [0, duration_s)."""
    rng = np.random.default_rng(seed)
    share = spec.duration_s / spec.spikes if spec.spikes else spec.duration_s
    spikes = [(i * share + float(rng.uniform(0.0, share - spec.spike_s))) for i in
              range(spec.spikes)]
    # Segment edges: the swell's steps, and each spike's start and end.
    edges = set(np.arange(0.0, spec.duration_s, spec.segment_s).tolist())
    edges |= {s for s in spikes} | {s + spec.spike_s for s in spikes}
    edges = sorted(e for e in edges if 0.0 <= e < spec.duration_s) + [spec.duration_s]
    out = []
    for a, b in zip(edges, edges[1:]):
        if b <= a:
            continue
        mid = math.floor(a / spec.segment_s) * spec.segment_s + spec.segment_s / 2
        swell = 0.5 * (1.0 - math.cos(2.0 * math.pi * min(mid, spec.duration_s) / spec.duration_s))
        rps = spec.base_rps + (spec.peak_rps - spec.base_rps) * swell
        if any(s <= a < s + spec.spike_s for s in spikes):
            rps *= spec.spike_factor
        out.append((a, b, rps))
    return tuple(out)


def code_arrivals(spec: CodeTraceSpec = CodeTraceSpec(), seed: int = 0) -> Arrivals:
    segments = code_schedule(spec, seed)
    # One independent stream per segment and one for the lengths, all derived from the seed.
    seeds = np.random.SeedSequence(seed).generate_state(len(segments) + 1)
    t = np.concatenate([gamma_arrivals(rps, end - start, spec.gap_cv, seed=int(s)).t + start
                        for (start, end, rps), s in zip(segments, seeds)])
    rng = np.random.default_rng(int(seeds[-1]))
    return Arrivals(t, lognormal_lengths(rng, len(t), spec.prompt_tokens, spec.prompt_cv),
                    lognormal_lengths(rng, len(t), spec.output_tokens, spec.output_cv))
