"""Step ("surge") detection in the rate trend, and what it does to the pool and to scale-down."""

from __future__ import annotations

import math
from dataclasses import replace
import random

import pytest

from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.policy import PolicyState, decide
from hbmserve.autoscale.signals import RateTrend, update_trend
from hbmserve.core.scaling import ReplicaSnapshot, ReplicaState, Snapshot, Tier
from hbmserve.autoscale.warm_pool import PoolEconomics, size_pool

TAUS = dict(fast_tau_s=5.0, slow_tau_s=120.0, variance_tau_s=600.0, slope_tau_s=300.0, z=1.0)
STARTUP = {Tier.HOT: 5.0, Tier.WARM: 45.0, Tier.COLD: 180.0}


def _run(rates: list[float], trend: RateTrend | None = None, start: int = 0) -> RateTrend:
    for i, r in enumerate(rates):
        trend = update_trend(trend, float(start + i), r, **TAUS)
    assert trend is not None
    return trend


def test_a_step_is_counted_once_remembered_at_its_peak_and_projected_inside_it():
    calm = _run([5.0] * 600)
    assert not calm.surging and calm.surge_count == 0.0
    inside = _run([25.0] * 30, calm, start=600)
    assert inside.surging and inside.surge_count == pytest.approx(1.0, abs=0.02)
    # The smoothed level is still climbing; the forecast already expects the step's top.
    assert inside.projected(0.0) >= inside.step_rps >= inside.level
    after = _run([25.0] * 300 + [5.0] * 600, inside, start=630)
    assert not after.surging
    assert after.surge_level == pytest.approx(25.0, rel=0.01)  # the level reached in the step
    assert after.surge_count == pytest.approx(math.exp(-900 / 3600), rel=0.02)  # one, decayed


def test_the_first_moments_never_read_as_a_step():
    # The driver's window fills from 0 during the first look-back: not a step from nothing.
    t = _run([0.0] + [5.0 * min(1.0, i / 30) for i in range(1, 120)])
    assert t.surge_count == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_poisson_noise_at_a_constant_rate_is_no_step(seed):
    rng = random.Random(seed)
    counts: list[int] = []
    trend = None
    for t in range(3600):
        counts = (counts + [sum(rng.random() < 5.5 / 20 for _ in range(20))])[-30:]
        trend = update_trend(trend, float(t), sum(counts) / len(counts), **TAUS)
    assert trend is not None and trend.surge_count == 0.0


def test_pool_insures_the_remembered_step_at_the_cost_rule():
    econ = PoolEconomics(hot_idle_usd_per_hour=10.0, warm_idle_usd_per_hour=2.5, slo_miss_usd=0.01)
    # One step to 25 rps seen over 1000 s (prior 600 s): 1/1600 steps per second.
    trend = RateTrend(level=5.0, baseline=5.0, slope=0.0, variance=0.0, at=0.0,
                      surge_level=25.0, surge_count=1.0, exposure_s=1000.0)
    pool = size_pool(target_active=1, trend=trend, replica_rps=8.0, replica_max_rps=10.0,
                     startup_s=STARTUP, economics=econ, hot_bounds=(0, 4), warm_bounds=(0, 0),
                     max_replicas=16)
    p_step = 1 - math.exp(-45.0 / 1600.0)
    saving = 0.01 * 10.0 * (180.0 - 5.0)  # a step's standby is measured against a cold start
    idle = 10.0 * 45.0 / 3600.0
    assert p_step * saving > idle
    # Kept while the step's 25 rps is above what the active replica and k standbys carry at
    # their full 10 rps while they bridge it: k=0, 1.
    expected = sum(1 for k in range(4) if 25.0 > 10.0 + k * 10.0)
    assert pool.hot == expected == 2
    # A warm node is kept for a step only while the step exceeds what the active replica and
    # the hot standbys carry at full capacity (10 + 2 x 10 = 30 rps): not for 25 rps, one for 35.
    for level, warm in ((25.0, 0), (35.0, 1)):
        both = size_pool(target_active=1, trend=replace(trend, surge_level=level),
                         replica_rps=8.0, replica_max_rps=10.0, startup_s=STARTUP, economics=econ,
                         hot_bounds=(0, 2), warm_bounds=(0, 4), max_replicas=16)
        assert (both.hot, both.warm) == (2, warm), level
    never = size_pool(target_active=1, trend=RateTrend(5.0, 5.0, 0.0, 0.0, 0.0),
                      replica_rps=8.0, replica_max_rps=10.0, startup_s=STARTUP, economics=econ,
                      hot_bounds=(0, 4), warm_bounds=(0, 0), max_replicas=16)
    assert never.hot == 0


def _snap(now: float, active: int, standby: int, rate: float) -> Snapshot:
    reps = [ReplicaSnapshot(f"a{i}", ReplicaState.ACTIVE, 0, 2, 0.1) for i in range(active)]
    reps += [ReplicaSnapshot(f"h{i}", ReplicaState.STANDBY) for i in range(standby)]
    return Snapshot(now=now, replicas=tuple(reps), ttft_samples_s=(0.3,) * 10,
                    arrival_rate_rps=rate)


def test_scale_down_demotes_surplus_actives_into_the_pool_they_fill():
    cfg = AutoscaleConfig(replica_capacity_rps=10.0, downscale_delay_s=0.0,
                          downscale_cooldown_s=0.0, max_replicas=3)
    stepped = RateTrend(level=5.0, baseline=5.0, slope=0.0, variance=0.0, at=0.0,
                        surge_level=25.0, surge_count=1.0, exposure_s=1000.0, z=1.0)
    state = PolicyState(target_active=3, trend=stepped)
    d, state = decide(_snap(1.0, 3, 0, 5.0), cfg, state)
    # 5 rps needs 1 replica; the pool wants 2 hot standbys and the 2 surplus actives are them:
    # down to 1 at once, with Serve's count (active + hot) still 3, even at max_replicas.
    assert (d.target_active, d.target_standby[Tier.HOT]) == (1, 2), d.reason
    assert d.reason.startswith("down 3→1")
    d, state = decide(_snap(2.0, 1, 2, 5.0), cfg, state)
    assert (d.target_active, d.target_standby[Tier.HOT]) == (1, 2), d.reason
