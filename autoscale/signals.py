"""The signals hbmserve's policy reads from a snapshot: p95 TTFT, queue depth, arrival-rate trend.

Pure functions over numbers; time arrives as data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hbmserve.autoscale.types import ReplicaState, Snapshot


def p95(samples: tuple[float, ...]) -> float | None:
    """Nearest-rank 95th percentile; None for no samples."""
    if not samples:
        return None
    ordered = sorted(samples)
    rank = math.ceil(0.95 * len(ordered))  # 1-based nearest rank
    return ordered[rank - 1]


@dataclass(frozen=True)
class Load:
    """What the ACTIVE replicas carry right now, plus requests held at the ingress."""

    active: int
    starting: int
    standby: int
    waiting: int
    running: int
    pending: int
    mean_kv_usage: float

    @property
    def queue_per_active(self) -> float:
        # With no active replica every queued request is "per replica" of the first one to come.
        return (self.waiting + self.pending) / max(self.active, 1)

    @property
    def in_flight(self) -> int:
        return self.waiting + self.running + self.pending


def load_of(snapshot: Snapshot) -> Load:
    active = [r for r in snapshot.replicas if r.state is ReplicaState.ACTIVE]
    kv = sum(r.kv_usage for r in active) / len(active) if active else 0.0
    return Load(
        active=len(active),
        starting=snapshot.count(ReplicaState.STARTING),
        standby=snapshot.count(ReplicaState.STANDBY),
        waiting=sum(r.waiting for r in active),
        running=sum(r.running for r in active),
        pending=snapshot.pending_at_ingress,
        mean_kv_usage=kv,
    )


def queue_need(load: Load, target_queue_per_replica: float) -> int:
    """Replicas that would bring the queue back to target; 0 means "no reason to grow".

    A replica with a queue is saturated, so it serves about `running/active` requests at once
    and may hold `target_queue_per_replica` more waiting; the excess needs one more replica
    per that many requests. While replicas are starting the queue says nothing new (it
    grows until they arrive, then drains), so it counts only when none is starting; the rate
    forecast covers that time.
    """
    queued = load.waiting + load.pending
    if load.active == 0:
        return 1 if queued > 0 else 0
    if load.starting > 0:
        return 0
    excess = queued - target_queue_per_replica * load.active
    if excess <= 0:
        return 0
    slots_per_replica = max(1.0, load.running / load.active) + target_queue_per_replica
    return load.active + math.ceil(excess / slots_per_replica)


@dataclass(frozen=True)
class RateTrend:
    """The arrival rate seen through two exponential averages, fast and slow.

    level: fast average (rps). baseline: slow average. On a linear ramp each average lags the
    rate by slope x its time constant, so slope = (level - baseline) / (slow tau - fast tau).
    slope_mean / slope_variance: how that estimate moves over the long window; under a noisy
    constant rate it wanders around 0, on a real ramp it holds steady, so only the part of the
    slope beyond `z` of its own spread is trusted. variance: spread (rps^2) of the observed
    rate around the trend line (baseline extrapolated by slope); bursts widen it, a steady
    ramp does not, and the pool sizing insures against it.
    """

    level: float
    baseline: float
    slope: float
    variance: float
    at: float
    slope_mean: float = 0.0
    slope_variance: float = 0.0
    z: float = 2.0

    @property
    def sigma(self) -> float:
        return math.sqrt(max(self.variance, 0.0))

    @property
    def trusted_slope(self) -> float:
        """Rising trend beyond noise; a falling one is left to the slow, hysteretic scale-down."""
        return max(0.0, self.slope - self.z * math.sqrt(max(self.slope_variance, 0.0)))

    def projected(self, horizon_s: float) -> float:
        """Rate expected `horizon_s` from now."""
        return self.level + self.trusted_slope * horizon_s


def update_trend(
    trend: RateTrend | None,
    now: float,
    rate_rps: float,
    *,
    fast_tau_s: float,
    slow_tau_s: float,
    variance_tau_s: float,
    slope_tau_s: float,
    z: float = 2.0,
) -> RateTrend:
    if trend is None:
        # Until the slope has shown how much it wanders, assume it may wander by the whole rate
        # per trend window: no trend is trusted at start-up.
        prior = (max(rate_rps, 1.0) / slow_tau_s) ** 2
        return RateTrend(level=rate_rps, baseline=rate_rps, slope=0.0, variance=0.0, at=now,
                         slope_variance=prior, z=z)
    dt = now - trend.at
    if dt <= 0:
        # Same instant seen twice (or a clock step back): nothing new to learn.
        return trend
    level = trend.level + (1.0 - math.exp(-dt / fast_tau_s)) * (rate_rps - trend.level)
    baseline = trend.baseline + (1.0 - math.exp(-dt / slow_tau_s)) * (rate_rps - trend.baseline)
    slope = (level - baseline) / (slow_tau_s - fast_tau_s)
    c = 1.0 - math.exp(-dt / variance_tau_s)
    # Deviation from the trend line, not from the lagging baseline: a steady ramp is not noise.
    deviation = rate_rps - (baseline + slope * slow_tau_s)
    variance = trend.variance + c * (deviation * deviation - trend.variance)
    e = 1.0 - math.exp(-dt / slope_tau_s)
    slope_mean = trend.slope_mean + e * (slope - trend.slope_mean)
    slope_dev = slope - slope_mean
    slope_variance = trend.slope_variance + e * (slope_dev * slope_dev - trend.slope_variance)
    return RateTrend(level=level, baseline=baseline, slope=slope, variance=variance, at=now,
                     slope_mean=slope_mean, slope_variance=slope_variance, z=z)
