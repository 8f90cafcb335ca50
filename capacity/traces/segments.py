"""What the piecewise-constant-rate trace generators share (capacity/traces/lulls_trace.py,
capacity/traces/diurnal_trace.py): a schedule of (start, end, rate) segments, a drift applied to it, the
named length mixes, and the arrivals drawn from it all.

Pure and seeded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from hbmserve.capacity.traces.arrivals import Arrivals, gamma_arrivals, lognormal_lengths

Segments = tuple[tuple[float, float, float], ...]  # (start_s, end_s, rps), covering [0, duration)


@dataclass(frozen=True)
class LengthMix:
    prompt_tokens: float  # means and coefficients of variation of log-normal lengths
    prompt_cv: float
    output_tokens: float
    output_cv: float


LENGTH_MIXES = {
    # Code completion: the file around the cursor in, a line or two out (capacity/traces/code_trace.py).
    "prompt-heavy": LengthMix(2000.0, 1.0, 30.0, 1.2),
    # Conversation: the Azure conversation trace's means are ~1150 and ~210.
    "chat": LengthMix(1000.0, 0.8, 250.0, 0.8),
}


class MixedLengths:
    """What a spec with a length mix does with its `mix`, `prompt_tokens` and `output_tokens`
    fields (each spec declares them, with its own default mix)."""

    mix: str
    prompt_tokens: float | None  # None: the mix's mean
    output_tokens: float | None

    def length_problems(self) -> list[str]:
        problems = []
        if self.mix not in LENGTH_MIXES:
            problems.append(f"mix {self.mix!r} is not one of {', '.join(LENGTH_MIXES)}")
        for name in ("prompt_tokens", "output_tokens"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                problems.append(f"{name} must be > 0")
        return problems

    @property
    def lengths(self) -> LengthMix:
        """The named mix, with its means replaced where given."""
        m = LENGTH_MIXES[self.mix]
        return replace(m, prompt_tokens=self.prompt_tokens or m.prompt_tokens,
                       output_tokens=self.output_tokens or m.output_tokens)


def modulated_schedule(levels: Sequence[tuple[float, float, float]], segment_s: float,
                       swell: Callable[[float], float]) -> Segments:
    """`levels` (start_s, end_s, rps, contiguous) times `swell(t)`, with `t` the middle of the
    `segment_s` step the piece lies in: each level is cut at the steps' edges."""
    out = []
    for start, end, rps in levels:
        edges = np.arange(math.ceil(start / segment_s) * segment_s, end, segment_s).tolist()
        cuts = [start] + [e for e in edges if start < e < end] + [end]
        for a, b in zip(cuts, cuts[1:]):
            mid = math.floor(a / segment_s) * segment_s + segment_s / 2
            out.append((a, b, rps * swell(mid)))
    return tuple(out)


def schedule_arrivals(segments: Segments, gap_cv: float, lengths: LengthMix, seed: int) -> Arrivals:
    """Gamma renewal arrivals in each segment at its rate (none where the rate is 0), with
    log-normal lengths drawn independently of the times."""
    # One independent stream per segment and one for the lengths, all derived from the seed.
    seeds = np.random.SeedSequence(seed).generate_state(len(segments) + 1)
    t = np.concatenate([np.zeros(0)] + [
        gamma_arrivals(rps, end - start, gap_cv, seed=int(s)).t + start
        for (start, end, rps), s in zip(segments, seeds) if rps > 0 and end > start])
    rng = np.random.default_rng(int(seeds[-1]))
    return Arrivals(t, lognormal_lengths(rng, len(t), lengths.prompt_tokens, lengths.prompt_cv),
                    lognormal_lengths(rng, len(t), lengths.output_tokens, lengths.output_cv))
