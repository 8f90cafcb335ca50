"""Arrive in time (issue 38, requirement 3): whether replicas ordered inside a burst would serve
enough of it to pay for themselves, judged by how long the bursts the memory saw lasted (the
envelope's `lengths_s`, the prior's included).

Why: on bursts shorter than a cold start (40-90 s bursts, 180 s start-up) a policy that orders
on every burst pays for replicas that arrive after it and bills them through the next lull;
that is how a smaller fixed fleet beat v3 on both attainment and GPU-hours.

Pure: the envelope and the config in, a LateStart (or None: order them) out.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hbmserve.autoscale.envelope import BurstEnvelope

if TYPE_CHECKING:  # policy_config imports nothing from here; the type is only an annotation
    from hbmserve.autoscale.policy_config import AutoscaleConfig


@dataclass(frozen=True)
class LateStart:
    """Replicas of a scale-up that would arrive too late to pay for themselves."""

    dropped: int  # replicas not ordered
    ready_in_s: float  # their start-up
    left_s: float  # of the burst when they would be ready
    why: str

    def describe(self) -> str:
        return self.why


def late_starts(n: int, startup_s: float, *, burst_age_s: float, rate_rps: float, env: BurstEnvelope | None,
                config: AutoscaleConfig) -> LateStart | None:
    """Whether `n` replicas that take `startup_s` to serve, ordered `burst_age_s` into a burst,
    would serve enough of it to pay for themselves (issue 38, requirement 3); None: order them.

    Only a burst is judged (the rate risen from the base by at least half the largest rise of
    the envelope's closed buckets, the prior's included), and only while it is younger than
    bursts last (`burst_length`: the median of those seen): one that outlasts a burst may be a
    new level, and replicas for a level always pay. A rise past every known peak is judged only
    once bursts have been seen to end: until their length is known it may be a level.
    A replica ready with L seconds of the burst left serves about replica_capacity_rps * L
    requests that would have missed; it costs its start-up, those L seconds and a scale-down
    delay at the hot replica's price."""
    if n <= 0 or env is None:
        return None
    length_s, seen = burst_length(env, config)
    if burst_age_s >= length_s:
        return None
    # Bursts seen before this one (the open bucket's rise is the burst now, known to nobody),
    # and a burst indeed: the rate risen from the base by at least half the largest of them. A
    # latency miss at a steady rate is no burst and gets its replicas.
    biggest = max(env.rises_rps, default=0.0)
    rise = rate_rps - env.base_rps
    if not biggest > 0 or rise < 0.5 * biggest:
        return None
    # Past every known peak it may be a new level: judged only once bursts have been seen to
    # end, so that their length is known and a level outlasting it gets its replicas.
    if rise > biggest and not env.lengths_s:
        return None
    left_s = max(0.0, length_s - burst_age_s - startup_s)
    saved_usd = config.replica_capacity_rps * left_s * config.slo_miss_usd
    cost_usd = config.hot_idle_usd_per_hour * (startup_s + left_s + config.downscale_delay_s) / 3600.0
    if saved_usd >= cost_usd:
        return None
    return LateStart(n, startup_s, left_s,
                     f"not in time: {n} replica(s) ready in {startup_s:.0f}s would find {left_s:.0f}s of a "
                     f"{length_s:.0f}-s burst ({seen}) {burst_age_s:.0f}s old (saves ${saved_usd:.2f}, "
                     f"costs ${cost_usd:.2f})")


def burst_length(env: BurstEnvelope, config: AutoscaleConfig) -> tuple[float, str]:
    """How long a burst lasts: the median of those the envelope saw end (the prior's included),
    else the config's `burst_length_s`; and where the figure comes from, for the reason."""
    if not env.lengths_s:
        return config.burst_length_s, "burst_length_s"
    return statistics.median(env.lengths_s), f"the median of {len(env.lengths_s)} seen"
