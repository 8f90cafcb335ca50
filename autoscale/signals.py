"""The signals hbmserve's policy reads from a snapshot: p95 TTFT, queue depth, arrival-rate trend.

Pure functions over numbers; time arrives as data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hbmserve.core.scaling import ReplicaState, Snapshot


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


def queue_need(load: Load, target_queue_per_replica: float, *, arrival_rps: float,
               replica_rps: float, horizon_s: float, drain_s: float) -> int:
    """Replicas (in all, starting ones included) that clear the queue's excess; 0 means
    "no reason to grow".

    A new replica serves nothing before `horizon_s` (the start-up of the tier it would come
    from), so what matters is the excess still queued then: the active replicas keep draining
    it at `replica_rps` each while arrivals add to it. If it is gone by then, another replica
    would only arrive to an empty queue (the old rule, one replica per running+queued slots of
    excess, ordered 16 replicas after a burst's backlog that 4 drained before any of them came).
    Otherwise the fleet must carry the arrivals plus that leftover within `drain_s`. Replicas
    already starting are part of the answer rather than a reason to ignore the queue: muting
    it for a whole cold start let one forecast-ordered replica hide a 5x step.
    """
    queued = load.waiting + load.pending
    if load.active == 0:
        return 1 if queued > 0 else 0
    excess = queued - target_queue_per_replica * load.active
    if excess <= 0:
        return 0
    left_at_ready = excess + (arrival_rps - load.active * replica_rps) * horizon_s
    if left_at_ready <= 0:
        return 0
    return math.ceil((arrival_rps + left_at_ready / drain_s) / replica_rps)


def latency_need(p95_s: float | None, target_s: float | None, active: int, max_growth: float,
                 muted: bool) -> int:
    """Replicas that bring a p95 latency (TTFT or TPOT) back to target; 0 when it is on target,
    unknown, or `muted` (samples from before a scale-up, or a queue's echo). Both latencies are
    taken to scale with the load per replica, so active·p95/target, at most `max_growth`x."""
    if p95_s is None or target_s is None or muted or p95_s <= target_s:
        return 0
    base = max(active, 1)
    return min(math.ceil(base * p95_s / target_s), math.ceil(base * max_growth))


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
    # Steps: the level jumping to surge_ratio x the baseline within a few smoothing times. The
    # spread above cannot see them: the trend line follows a step within a minute, so a 5x
    # step leaves sigma under 1 rps. What a step tells the pool is how high the rate went
    # (surge_level) and how often steps come (surge_count over exposure_s, both decayed).
    surging: bool = False
    surge_level: float = 0.0  # peak of the last finished step
    step_peak: float = 0.0  # peak so far of the step under way
    surge_count: float = 0.0
    exposure_s: float = 0.0

    def surges_per_s(self, prior_s: float) -> float:
        """Steps per second seen; `prior_s` of step-free time is assumed before the first
        observation, so one early step does not read as a storm."""
        return self.surge_count / (self.exposure_s + prior_s)

    @property
    def step_rps(self) -> float:
        """How high the next (or the current) step is expected to go: the last one's peak."""
        return max(self.surge_level, self.step_peak) if self.surging else self.surge_level

    @property
    def sigma(self) -> float:
        return math.sqrt(max(self.variance, 0.0))

    @property
    def trusted_slope(self) -> float:
        """Rising trend beyond noise; a falling one is left to the slow, hysteretic scale-down."""
        return max(0.0, self.slope - self.z * math.sqrt(max(self.slope_variance, 0.0)))

    def projected(self, horizon_s: float) -> float:
        """Rate expected `horizon_s` from now. Inside a step, at least as high as the last
        step went: the smoothed level takes tens of seconds to climb a step, and ordering
        one replica per few seconds of that climb let the pool be spent on the first few."""
        ahead = self.level + self.trusted_slope * horizon_s
        return max(ahead, self.step_rps) if self.surging else ahead


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
    surge_ratio: float = 1.5,
    surge_tau_s: float = 3600.0,
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
    keep = math.exp(-dt / surge_tau_s)
    count, exposure = trend.surge_count * keep, trend.exposure_s * keep + dt
    # The step ends once the slow average has caught up with most of it. None is seen before
    # the slow average has had its own time constant to settle: the driver's rate window is
    # still filling then, and every start would read as a step up from nothing.
    settled = exposure >= slow_tau_s
    surging = settled and (level > surge_ratio * baseline if not trend.surging
                           else level > 1.25 * baseline)
    surge_level, step_peak = trend.surge_level, trend.step_peak
    if surging and not trend.surging:
        count, step_peak = count + 1.0, level
    elif surging:
        step_peak = max(step_peak, level)
    elif trend.surging:
        surge_level = step_peak
    return RateTrend(level=level, baseline=baseline, slope=slope, variance=variance, at=now,
                     slope_mean=slope_mean, slope_variance=slope_variance, z=z,
                     surging=surging, surge_level=surge_level, step_peak=step_peak,
                     surge_count=count,
                     exposure_s=exposure)
