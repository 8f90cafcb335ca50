"""Cumulative histograms as Prometheus keeps them, and quantiles read from their buckets.

`hbmserve status` reports p95 TTFT and TPOT from the engines' own histograms (vLLM's
`vllm:time_to_first_token_seconds` and `vllm:request_time_per_output_token_seconds`, the sim
engine's copies): the same buckets Prometheus scrapes, read with the same interpolation as
PromQL's `histogram_quantile`, so the CLI and a Grafana panel agree on one number.
"""

from __future__ import annotations

import math
from typing import Iterable

from hbmserve.core.records import Histogram


def merge(histograms: Iterable[Histogram]) -> Histogram | None:
    """The sum of histograms with the same bounds (replicas of one model); None for none.
    Different bounds are a ValueError: their buckets cannot be added."""
    merged: Histogram | None = None
    for h in histograms:
        if merged is None:
            merged = h
            continue
        if h.bounds != merged.bounds:
            raise ValueError(f"histogram bounds differ: {merged.bounds} and {h.bounds}")
        merged = Histogram(bounds=h.bounds, cumulative=tuple(a + b for a, b in zip(merged.cumulative, h.cumulative)),
                           count=merged.count + h.count, sum=merged.sum + h.sum)
    return merged


def quantile(h: Histogram, q: float) -> float | None:
    """PromQL's histogram_quantile: the rank q*count found in its bucket and interpolated
    linearly inside it (the first bucket starts at 0); a rank in the +Inf bucket answers the
    highest finite bound. None when there are no observations."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    if h.count <= 0 or not h.bounds:
        return None
    rank = q * h.count
    lower, below = 0.0, 0.0
    for bound, cum in zip(h.bounds, h.cumulative):
        if cum >= rank and cum > below:
            return lower + (bound - lower) * (rank - below) / (cum - below)
        lower, below = bound, cum
    return h.bounds[-1]


def from_buckets(buckets: Iterable[tuple[float, float]], total_sum: float = 0.0) -> Histogram:
    """A Histogram from (upper bound, cumulative count) pairs, +Inf included (its count is the
    total); bounds sorted, pairs with the same bound summed (several engines of one replica)."""
    by_bound: dict[float, float] = {}
    for bound, cum in buckets:
        by_bound[bound] = by_bound.get(bound, 0.0) + cum
    finite = sorted(b for b in by_bound if math.isfinite(b))
    count = by_bound.get(math.inf, by_bound[finite[-1]] if finite else 0.0)
    return Histogram(bounds=tuple(float(b) for b in finite), cumulative=tuple(float(by_bound[b]) for b in finite),
                     count=float(count),
                     sum=float(total_sum))
