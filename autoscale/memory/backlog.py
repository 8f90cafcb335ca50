"""What a bucket's traffic would have missed at each headroom over its base: a fluid queue per
headroom, fed the rate the policy sees (issue 38, requirement 4).

Why: the envelope priced each bucket's top as a rectangle, its peak held for `burst_length_s`.
Real bursts are not rectangles: a look-back mean that touches its top for a few seconds and a
burst that sits there for two minutes have the same peak. On the lulls-and-bursts traces the
rectangle made a 17.9 req/s top over three replicas' 15.9 cost ~1,300 misses, so the policy held
a fourth replica, where a fixed fleet of three missed 0.2% of the whole hour; and when a few such
tops left the memory it held two (four attempts to price the top better, docs/benchmarks.md,
each failed on one trace or another). The fluid queue measures each bucket's own shape instead.

The model: a headroom h over the base serves base + h requests/s. Each rate sample (rate r, dt
seconds since the last) grows its backlog by (r - base - h)·dt, never below 0; while the backlog
is more than the TTFT target's worth of that capacity, the arrivals of those dt seconds miss.
Headrooms are a grid of `step_rps` (a quarter of a replica's capacity); the queues carry over
from one bucket into the next, so a burst that straddles the edge is counted whole; each bucket
keeps its misses per headroom, trailing zeros dropped (every larger headroom missed nothing).
Checked against the simulator's fixed fleets on seven generated traces (docs/benchmarks.md): it
says 3 replicas miss nothing on every lulls seed where the rectangle asked for 4.

Pure: tuples in, tuples out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# A gap between samples longer than this is not integrated: nobody saw the rate in between
# (a restarted controller, a stalled driver).
MAX_DT_S = 10.0


def step_of(replica_rps: float) -> float:
    """The headroom grid's step: a quarter of a replica, fine enough to tell n from n + 1."""
    return replica_rps / 4.0


def advance(queues: Sequence[float], misses: Sequence[float], *, rate_rps: float, base_rps: float,
            dt_s: float, step_rps: float, ttft_s: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The backlog per headroom and the bucket's misses per headroom after one rate sample."""
    dt_s = min(dt_s, MAX_DT_S)
    if dt_s <= 0 or step_rps <= 0:
        return tuple(queues), tuple(misses)
    # Headrooms the rate reached, and those still draining a backlog: every larger one is idle.
    reached = int(max(0.0, rate_rps - base_rps) // step_rps) + 1
    width = max(reached, len(queues))
    qs, ms = [*queues, *[0.0] * (width - len(queues))], [*misses, *[0.0] * (width - len(misses))]
    for j in range(width):
        served = base_rps + j * step_rps
        qs[j] = max(0.0, qs[j] + (rate_rps - served) * dt_s)
        if qs[j] > served * ttft_s:
            ms[j] += rate_rps * dt_s
    while qs and qs[-1] == 0.0:
        qs.pop()
    return tuple(qs), tuple(ms)


def closed(misses: Sequence[float]) -> tuple[float, ...]:
    """A closed bucket's misses as kept: whole-ish numbers, trailing zeros dropped."""
    kept = [round(m, 1) for m in misses]
    while kept and kept[-1] == 0.0:
        kept.pop()
    return tuple(kept)


def missed_at(curve: Sequence[float], headroom_rps: float, step_rps: float, bucket_s: float) -> float:
    """A bucket's misses at `headroom_rps` over the base, between the grid's points. Below the
    base (a negative headroom) the queue grows all bucket long: what the bucket missed at the
    base plus the deficit, so that fewer replicas never look cheaper."""
    if headroom_rps < 0:
        return (curve[0] if curve else 0.0) - headroom_rps * bucket_s
    x = headroom_rps / step_rps
    j = math.floor(x)
    if j >= len(curve):
        return 0.0
    # Past the last point the curve is 0 (its trailing zeros were dropped), so the last step
    # slopes to 0 like every other: read flat, a headroom a hair under the next grid point
    # cost all the misses of the point below it (burst-1 held a fourth replica for that).
    after = curve[j + 1] if j + 1 < len(curve) else 0.0
    return curve[j] + (x - j) * (after - curve[j])


def regrid(curve: Sequence[float], from_step_rps: float, to_step_rps: float) -> tuple[float, ...]:
    """A curve measured on one grid, read on another (a prior learnt at another capacity)."""
    if from_step_rps == to_step_rps or not curve:
        return tuple(curve)
    width = math.ceil(len(curve) * from_step_rps / to_step_rps)
    return closed([missed_at(curve, j * to_step_rps, from_step_rps, 0.0) for j in range(width)])
