"""A prior for the burst envelope, learnt from a service's past traffic (issue 38, requirement 1).

Why: the envelope (autoscale/envelope.py) learns how far the rate climbs within one cold start,
but it starts empty, so the first burst after every deploy, restart or evaluation is a surprise
that a real service, which ran yesterday, need not meet. A prior is that memory written down:
`hbmserve autoscale learn --trace past.csv --out prior.yaml` writes it, the config takes it as
`autoscaling.prior`, and the policy starts its envelope from it.

How it is learnt: the same envelope, fed the rate the policy would have seen (the look-back
mean of arrivals, each `interval_s`, as the simulator's snapshot reports it) over the whole past
trace, keeping every bucket. A prior holds at most as many buckets as the envelope remembers
(`burst_memory_s` / bucket); a longer past is summarised by evenly spaced quantiles of its rises,
so yesterday's bursts keep their share of the buckets, each with what it would have missed at
each headroom (memory/backlog.py). The policy keeps the prior's buckets for good beside its
live ones: a quiet half hour must not erase what the past taught (lulls-3 held 2 replicas once
the prior had rolled out of a 30-minute memory, and met its next burst with 1,331 misses). The
prior also keeps where its bursts rose from (the median base), which stands in for the base
until the live memory has lows of its own: the first rate seen may be a burst's.
How long each burst lasted is learnt the same way (the envelope's `lengths_s`, the same
quantiles): the "not in time" rule judges a burst by them.

Pure: arrival times in, a PriorSpec out. A history kept as a rate each step (Prometheus's)
becomes arrival times first (`arrivals_of_rates`).
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from collections.abc import Sequence

from dataclasses import replace

from hbmserve.autoscale.memory.backlog import step_of
from hbmserve.autoscale.envelope import BurstEnvelope, EnvelopeFloor, bucket_of, burst_floor, observed_envelope
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.core.autoscaling_spec import PriorSpec


class PriorError(ValueError):
    """The past cannot teach a prior (too short, or the envelope is off): the message says why."""


def rate_samples(arrivals_s: Sequence[float], look_back_s: float, interval_s: float):
    """(now, the look-back mean rate) each `interval_s` from 0 past the last arrival, as a driver's
    snapshot reports it: over the part of the window seen, at least 1 s, until it fills."""
    if not arrivals_s:
        return
    ticks = math.ceil((arrivals_s[-1] + interval_s) / interval_s)  # the last one at or past the last arrival
    for i in range(ticks):
        now = i * interval_s
        seen = min(look_back_s, max(now, 1.0))
        n = bisect_right(arrivals_s, now) - bisect_right(arrivals_s, now - look_back_s)
        yield now, n / seen


def arrivals_of_rates(rates: Sequence[tuple[float, float]], step_s: float) -> list[float]:
    """Arrival times (seconds from the first step's start) that a rate history implies: each
    (t, requests/s) sample, sorted by t, covers the step before t; its requests are spread evenly
    over it. Fractions carry over to the next step, so n steps of 0.1 req/s at 1 s make n/10."""
    if not rates:
        return []
    start, carry, out = rates[0][0] - step_s, 0.0, []
    for t, rate in rates:
        carry += max(rate, 0.0) * step_s
        n = int(carry + 1e-9)
        carry -= n
        out += [t - step_s - start + (k + 0.5) * step_s / n for k in range(n)]
    return out


def observed_rises(arrivals_s: Sequence[float], config: AutoscaleConfig, interval_s: float = 1.0) -> tuple[float, ...]:
    """Every closed bucket's rise over the trace, oldest first (nothing forgotten)."""
    return observed(arrivals_s, config, interval_s).rises_rps


def observed(arrivals_s: Sequence[float], config: AutoscaleConfig, interval_s: float = 1.0) -> BurstEnvelope:
    """The envelope after the whole trace, nothing forgotten: every closed bucket's rise, and
    every burst that ended, oldest first."""
    return observed_with_bases(arrivals_s, config, interval_s)[0]


def observed_with_bases(arrivals_s: Sequence[float], config: AutoscaleConfig,
                        interval_s: float = 1.0) -> tuple[BurstEnvelope, list[float]]:
    """`observed`, and the base (where a burst would rise from) as each bucket closed."""
    bucket = bucket_of(config)
    everything_s = (arrivals_s[-1] if arrivals_s else 0.0) + 2 * bucket
    env = BurstEnvelope(bucket_started_at=config.look_back_s, step_rps=step_of(config.replica_capacity_rps))
    bases = []
    for now, rate in rate_samples(arrivals_s, config.look_back_s, interval_s):
        before = env.bucket_started_at
        env = env.observe(now, rate, bucket, everything_s, config.ttft_p95_target_s)
        if env.bucket_started_at != before and env.previous_min_rps is not None:
            bases.append(min(m for m in (env.earlier_min_rps, env.previous_min_rps) if m is not None))
    return env, bases


def summarise(rises: Sequence[float], keep: int) -> tuple[float, ...]:
    """At most `keep` rises with the same spread as `rises`: evenly spaced quantiles, smallest first."""
    ordered = sorted(rises)
    return tuple(ordered[i] for i in quantile_picks(len(ordered), keep))


def quantile_picks(count: int, keep: int) -> list[int]:
    """Which of `count` sorted values evenly spaced quantiles keep: all of them when they fit."""
    if count <= keep:
        return list(range(count))
    if keep == 1:
        return [count - 1]
    return [round(i * (count - 1) / (keep - 1)) for i in range(keep)]


def learn_prior(arrivals_s: Sequence[float], config: AutoscaleConfig, source: str = "",
                interval_s: float = 1.0) -> PriorSpec:
    """The prior a service's past arrivals (seconds, sorted) teach the envelope of `config`.
    Raises PriorError when the past is shorter than one bucket: it has nothing to teach."""
    if config.burst_memory_s <= 0:
        raise PriorError("autoscaling.burst.memory_s is 0: the burst envelope is off, so a prior would be unused")
    bucket = bucket_of(config)
    env, bases = observed_with_bases(arrivals_s, config, interval_s)
    rises = env.rises_rps
    if not rises:
        span = arrivals_s[-1] if arrivals_s else 0.0
        raise PriorError(f"the trace spans {span:.0f} s: a prior needs at least one {bucket:g}-s bucket after "
                         f"the first {config.look_back_s:g}-s look-back")
    keep = max(1, math.ceil(config.burst_memory_s / bucket))
    # The buckets kept, smallest rise first, each with its own misses per headroom.
    by_rise = sorted(zip(rises, env.curves[:-1]), key=lambda rc: rc[0])
    kept = [by_rise[i] for i in quantile_picks(len(by_rise), keep)]
    return PriorSpec(bucket_s=bucket, rises_rps=tuple(round(r, 4) for r, _ in kept),
                     misses=tuple(c or () for _, c in kept), miss_step_rps=env.step_rps,
                     base_rps=round(statistics.median(bases), 4) if bases else None,
                     lengths_s=tuple(round(s, 1) for s in summarise(env.lengths_s, keep)),
                     learned_from=f"{source} ({len(rises)} buckets of {bucket:g} s, "
                                  f"{len(env.lengths_s)} bursts)".strip())


def learnt_config(config: AutoscaleConfig, prior: PriorSpec) -> AutoscaleConfig:
    """`config` starting its envelope from `prior`."""
    return replace(config, prior_rises_rps=prior.rises_rps, prior_lengths_s=prior.lengths_s,
                   prior_misses=prior.misses, prior_miss_step_rps=prior.miss_step_rps,
                   prior_base_rps=prior.base_rps,
                   prior_source=prior.learned_from)


def held_before_traffic(config: AutoscaleConfig) -> EnvelopeFloor | None:
    """What the prior alone makes the policy hold at its first decision; None: the envelope is off."""
    return burst_floor(observed_envelope(None, 0.0, 0.0, config), config)


def prior_hold(config: AutoscaleConfig) -> int:
    """Replicas the prior alone holds before any traffic, for operators; 0 without a prior."""
    held = held_before_traffic(config) if config.prior_rises_rps else None
    return held.replicas if held is not None else 0
