"""A burst's top, once seen (autoscale/envelope.py `known_peak`, issue 38 requirements 3-4):
inside a burst like one seen before, the trend is not projected past its top, neither for
replicas nor for standbys; a ramp, a new level and a first burst still follow the trend."""

from __future__ import annotations

from dataclasses import replace

from hbmserve.autoscale.envelope import BurstEnvelope, known_peak
from hbmserve.autoscale.policy import PolicyState, decide
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.signals import RateTrend
from hbmserve.autoscale.warm_pool import PoolEconomics, size_pool
from hbmserve.core.scaling import ReplicaSnapshot, ReplicaState, Snapshot, Tier

BUCKET, MEMORY = 180.0, 1800.0
CONFIG = AutoscaleConfig(replica_capacity_rps=5.0, max_replicas=16, hot_standby_max=0, warm_pool_max=0,
                         upscale_delay_s=0.0, rate_upscale_delay_s=0.0)
# Lulls at 1 rps, bursts 13 higher (a top at 14 rps: 3 replicas of 5 carry it), and the rate seen to come down.
SEEN = BurstEnvelope(bucket_started_at=0.0, previous_min_rps=1.0, rises_rps=(0.5, 13.0, 0.4), fell_at=0.0)


def _observe(rates: list[float]) -> BurstEnvelope:
    env = BurstEnvelope(bucket_started_at=0.0)
    for i, r in enumerate(rates):
        env = env.observe(float(i), r, BUCKET, MEMORY)
    return env


def test_a_top_is_known_once_the_rate_came_down_and_only_up_to_it():
    known = known_peak(SEEN, 10.0, CONFIG)
    assert known is not None and known.peak_rps == 14.0 and known.replicas == 3
    assert known_peak(SEEN, 20.0, CONFIG) is None  # past every top seen: a new level
    assert known_peak(replace(SEEN, fell_at=None), 10.0, CONFIG) is None  # never came down: a ramp
    assert known_peak(replace(SEEN, rises_rps=()), 10.0, CONFIG) is None  # nothing closed yet
    assert known_peak(None, 10.0, CONFIG) is None


def test_the_rate_coming_down_is_seen_and_a_ramp_never_is():
    bursts = _observe(([1.0] * 200 + [14.0] * 100) * 3)
    assert bursts.fell_at is not None
    ramp = _observe([1.0 + 0.01 * t for t in range(900)])
    assert ramp.fell_at is None and len(ramp.rises_rps) == 4


def test_a_burst_longer_than_a_bucket_is_measured_from_its_lull():
    # A 300-s burst covers two whole buckets: the second is still measured from the lull before.
    env = _observe([1.0] * 360 + [15.0] * 300 + [1.0] * 200)
    assert env.rises_rps[2:4] == (14.0, 14.0)


def _snap(now: float, rate: float, active: int) -> Snapshot:
    reps = tuple(ReplicaSnapshot(f"r{i}", ReplicaState.ACTIVE, 0, 2, 0.1) for i in range(active))
    return Snapshot(now=now, replicas=reps, arrival_rate_rps=rate, ttft_samples_s=(0.3,) * 20)


def _climb(state: PolicyState, config: AutoscaleConfig) -> tuple[int, str]:
    """A lull at 1 rps, then a climb of 0.2 rps/s to 13 rps: the highest target asked for, and
    the reason once the top is reached."""
    most, reason = 0, ""
    for t in range(400):
        rate = 1.0 if t < 300 else min(13.0, 1.0 + 0.2 * (t - 300))
        decision, state = decide(_snap(float(t), rate, 3), config, state)
        most = max(most, decision.target_active)
        reason = decision.reason if t == 360 else reason
    return most, reason


def test_inside_a_known_burst_the_trend_is_not_projected_past_its_top():
    known, reason = _climb(PolicyState(target_active=3, envelope=SEEN), CONFIG)
    assert known == 3 and "within the known peak" in reason
    # The same climb with nothing remembered: the trend over a cold start orders more.
    unknown, _ = _climb(PolicyState(target_active=3), replace(CONFIG, burst_memory_s=0.0))
    assert unknown > 3


def test_no_standby_is_kept_for_a_climb_past_a_known_top():
    trend = RateTrend(level=13.0, baseline=6.0, slope=0.05, variance=1.0, at=0.0)
    kw = dict(target_active=3, trend=trend, replica_rps=4.0, replica_max_rps=5.0,
              startup_s={Tier.HOT: 5.0, Tier.WARM: 45.0, Tier.COLD: 180.0},
              economics=PoolEconomics(10.0, 2.0, 0.01), hot_bounds=(0, 4), warm_bounds=(0, 4), max_replicas=16)
    assert size_pool(**kw).hot > 0
    held = size_pool(**kw, known_top_rps=14.0)
    assert (held.hot, held.warm) == (0, 0)
    # A top the fleet cannot carry still gets its standbys.
    assert size_pool(**kw, known_top_rps=20.0).hot > 0
