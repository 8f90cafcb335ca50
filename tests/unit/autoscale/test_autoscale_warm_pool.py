"""Standby pool sizing: the cost model in autoscale/warm_pool.py, checked by hand."""

from __future__ import annotations

from statistics import NormalDist

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hbmserve.autoscale.signals import RateTrend
from hbmserve.core.scaling import Tier
from hbmserve.autoscale.warm_pool import (PoolEconomics, PoolHold, hold_tier, prob_rate_exceeds,
                                         size_pool)

STARTUP = {Tier.HOT: 5.0, Tier.WARM: 45.0, Tier.COLD: 180.0}


def flat(level: float, sigma: float) -> RateTrend:
    return RateTrend(level=level, baseline=level, slope=0.0, variance=sigma**2, at=0.0)


def test_probability_matches_the_normal_tail():
    assert prob_rate_exceeds(5.0, 0.0, 4.9) == 1.0
    assert prob_rate_exceeds(5.0, 0.0, 5.0) == 0.0
    assert prob_rate_exceeds(5.0, 1.0, 5.0) == pytest.approx(0.5)
    assert prob_rate_exceeds(5.0, 0.5, 6.0) == pytest.approx(1 - NormalDist(5.0, 0.5).cdf(6.0))


def _expected_count(mu, sigma, covered, step, saving, idle, upper):
    """The rule in the module docstring, written out independently."""
    k = 0
    while k < upper and (1 - NormalDist(mu, sigma).cdf(covered + k * step)) * saving > idle:
        k += 1
    return k


@pytest.mark.parametrize("level, sigma", [(5.5, 0.43), (5.5, 1.5), (9.0, 2.0), (2.0, 0.1)])
def test_pool_follows_the_cost_rule(level, sigma):
    econ = PoolEconomics(hot_idle_usd_per_hour=10.0, warm_idle_usd_per_hour=2.5, slo_miss_usd=0.01)
    pool = size_pool(target_active=7, trend=flat(level, sigma), replica_rps=0.8,
                     replica_max_rps=1.0, startup_s=STARTUP, economics=econ,
                     hot_bounds=(0, 3), warm_bounds=(0, 6), max_replicas=16)
    hot_saving = 0.01 * 1.0 * (45.0 - 5.0)
    hot_idle = 10.0 * 45.0 / 3600
    hot = _expected_count(level, sigma, 7 * 0.8, 0.8, hot_saving, hot_idle, 3)
    warm_saving = 0.01 * 1.0 * (180.0 - 45.0)
    warm_idle = 2.5 * 180.0 / 3600
    warm = _expected_count(level, sigma, 7 * 0.8 + hot * 0.8, 0.8, warm_saving, warm_idle, 6)
    assert (pool.hot, pool.warm) == (hot, warm)
    assert f"pool hot {hot}" in pool.reason


def test_burstier_traffic_keeps_more_standbys():
    econ = PoolEconomics(10.0, 2.5, 0.01)
    kw = dict(target_active=7, replica_rps=0.8, replica_max_rps=1.0, startup_s=STARTUP,
              economics=econ, hot_bounds=(0, 4), warm_bounds=(0, 8), max_replicas=16)
    calm = size_pool(trend=flat(5.5, 0.2), **kw)
    bursty = size_pool(trend=flat(5.5, 2.0), **kw)
    assert bursty.hot + bursty.warm > calm.hot + calm.warm


def test_bounds_and_room_under_max_replicas():
    free = PoolEconomics(0.0, 0.0, 1.0)  # idle costs nothing: the model wants the maximum
    kw = dict(trend=flat(5.5, 2.0), replica_rps=0.8, replica_max_rps=1.0, startup_s=STARTUP,
              economics=free, hot_bounds=(0, 3), warm_bounds=(0, 5))
    assert (lambda p: (p.hot, p.warm))(size_pool(target_active=7, max_replicas=16, **kw)) == (3, 5)
    tight = size_pool(target_active=14, max_replicas=16, **kw)
    assert (tight.hot, tight.warm) == (2, 0)  # only 2 replicas of room left
    dear = PoolEconomics(1e6, 1e6, 0.01)  # the model wants none; the minimum still holds
    kept = size_pool(target_active=7, max_replicas=16, trend=flat(5.5, 2.0), replica_rps=0.8,
                     replica_max_rps=1.0, startup_s=STARTUP, economics=dear,
                     hot_bounds=(1, 3), warm_bounds=(2, 5))
    assert (kept.hot, kept.warm) == (1, 2)


# ---- hold_tier: the pool's hysteresis ----

def test_a_wish_held_for_the_delay_applies_its_extreme_a_flip_restarts_the_clock():
    h = hold_tier(None, 1, 0.0, 30.0, 60.0)
    assert h == PoolHold(1)  # the first wish stands
    h = hold_tier(h, 3, 10.0, 30.0, 60.0)
    h = hold_tier(h, 2, 20.0, 30.0, 60.0)
    assert h.held == 1 and h.since == 10.0 and h.pending == 2
    h = hold_tier(h, 4, 40.0, 30.0, 60.0)  # 30 s above: up to the lowest wished meanwhile
    assert h == PoolHold(2)
    h = hold_tier(h, 0, 50.0, 30.0, 60.0)
    h = hold_tier(h, 5, 60.0, 30.0, 60.0)  # flipped up: the down clock is gone
    assert h.held == 2 and h.since == 60.0
    h = hold_tier(h, 2, 61.0, 30.0, 60.0)  # back at what is held: nothing pending
    assert h == PoolHold(2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 40.0), st.integers(0, 4)), min_size=1, max_size=40))
def test_the_count_moves_exactly_when_a_wish_has_held_its_side_for_the_delay(steps):
    up_s, down_s = 30.0, 60.0
    now, h, run = 0.0, None, []  # run: (time, wish) since the wish left what is held
    for dt, wish in steps:
        now += dt
        before = h.held if h is not None else wish
        h = hold_tier(h, wish, now, up_s, down_s)
        side = (wish > before) - (wish < before)
        if side == 0 or (run and ((run[0][1] > before) - (run[0][1] < before)) != side):
            run = []
        if side:
            run.append((now, wish))
        lasted = bool(run) and now - run[0][0] >= (up_s if side > 0 else down_s)
        if lasted:  # moves to the least extreme wish of the run
            extreme = min(w for _, w in run) if side > 0 else max(w for _, w in run)
            assert h == PoolHold(extreme), (run, h)
            run = []
        else:
            assert h.held == before, (run, h)
