"""hbmserve's scaling policy: hand-computed cases and hypothesis properties."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.policy import PolicyState, decide, plan_promotions, rate_need, tier_sequence
from hbmserve.autoscale.signals import RateTrend
from hbmserve.core.scaling import ReplicaSnapshot, ReplicaState, Snapshot, Tier


def snap(now: float, *, active: int = 0, starting: int = 0, standby: int = 0, waiting: int = 0,
         running: int = 0, rate: float = 0.0, ttft: tuple[float, ...] = (), pending: int = 0,
         warm_ready: int = 0, kv: float = 0.0) -> Snapshot:
    reps = [ReplicaSnapshot(f"a{i}", ReplicaState.ACTIVE, waiting, running, kv)
            for i in range(active)]
    reps += [ReplicaSnapshot(f"s{i}", ReplicaState.STARTING) for i in range(starting)]
    reps += [ReplicaSnapshot(f"h{i}", ReplicaState.STANDBY) for i in range(standby)]
    return Snapshot(now=now, replicas=tuple(reps), ttft_samples_s=ttft, arrival_rate_rps=rate,
                    pending_at_ingress=pending, warm_ready=warm_ready)


NO_DELAY = AutoscaleConfig(upscale_delay_s=0.0, rate_upscale_delay_s=0.0)


def test_rate_burst_scales_to_rate_over_capacity_at_target_utilization():
    d, s = decide(snap(0.0, active=4, running=2, rate=7.9), NO_DELAY, PolicyState())
    assert d.target_active == math.ceil(7.9 / (1.0 * 0.8)) == 10
    assert s.target_active == 10 and s.last_scale_up_at == 0.0
    assert "up 4→10" in d.reason and "7.90 rps" in d.reason


def test_queue_burst_sizes_the_fleet_by_the_backlog_left_when_new_replicas_arrive():
    # 2 active at 1 rps each under 3 rps; excess 60 - 4 x 2 = 52 queued. No standby, no warm
    # node: help is a cold start (180 s) away. Left then: 52 + (3 - 2) x 180 = 232, to be
    # gone within one more cold start-up (180 s, backlog_drain_s) on top of the 3 rps arriving.
    d, _ = decide(snap(0.0, active=2, running=8, waiting=30, rate=3.0), NO_DELAY, PolicyState())
    assert d.target_active == math.ceil((3.0 + (52 + (3.0 - 2.0) * 180.0) / 180.0) / 1.0) == 5


def test_queue_that_drains_before_any_new_replica_could_arrive_orders_none():
    # Same excess of 52, but 2 replicas serve 2 rps against 1 arriving: gone in 52 s < 180 s.
    # (Before, one replica per running + queued slots of excess was ordered regardless: 7.)
    d, _ = decide(snap(0.0, active=2, running=8, waiting=30, rate=1.0), NO_DELAY, PolicyState())
    assert d.target_active == 2


def test_queue_counts_replicas_already_starting_toward_its_need():
    # The backlog of the case above needs 5 in all: the 3 starting make 5, so nothing is added.
    d, _ = decide(snap(0.0, active=2, starting=3, running=8, waiting=30, rate=3.0), NO_DELAY,
                  PolicyState())
    assert d.target_active == 5
    # At 5 rps it needs ceil((5 + (52 + 3 x 180) / 180) / 1) = 9: starting ones no longer mute it.
    d, _ = decide(snap(0.0, active=2, starting=3, running=8, waiting=30, rate=5.0), NO_DELAY,
                  PolicyState())
    assert d.target_active == math.ceil(5.0 + (52 + 3.0 * 180.0) / 180.0) == 9


def test_ttft_echo_of_a_drained_queue_is_not_scaled_on():
    cfg = AutoscaleConfig(upscale_delay_s=0.0, rate_upscale_delay_s=0.0, max_replicas=16)
    slow = (40.0,) * 20  # the backlog's wait, still in the look-back window
    s = PolicyState()
    d, s = decide(snap(0.0, active=4, running=8, waiting=30, rate=1.0), cfg, s)
    d, s = decide(snap(1.0, active=4, running=8, rate=1.0, ttft=slow), cfg, s)
    assert d.target_active == 4 and s.queue_over_at == 0.0
    # Once the queue has been under target for a whole window, a slow TTFT is a symptom again.
    d, s = decide(snap(cfg.look_back_s, active=4, running=8, rate=1.0, ttft=slow), cfg, s)
    assert d.target_active == math.ceil(4 * cfg.max_latency_growth) == 8


@pytest.mark.parametrize("p95_s, expected", [(3.0, math.ceil(4 * 3.0 / 2.0)),  # 6
                                             (10.0, math.ceil(4 * 2.0))])  # growth capped: 8
def test_ttft_over_target_scales_proportionally(p95_s, expected):
    samples = (0.5,) * 18 + (p95_s,) * 2  # nearest-rank p95 of 20 is the 19th smallest
    d, _ = decide(snap(0.0, active=4, running=1, ttft=samples), NO_DELAY, PolicyState())
    assert d.target_active == expected


def test_ttft_ignored_until_new_replicas_can_show_in_the_window():
    cfg = AutoscaleConfig(upscale_delay_s=0.0, rate_upscale_delay_s=0.0, max_replicas=16)
    d, s = decide(snap(0.0, active=4, running=2, rate=7.9), cfg, PolicyState())
    assert d.target_active == 10  # six new replicas, all from the cold tier
    blind_until = 0.0 + cfg.startup_cold_s + cfg.look_back_s
    assert s.latency_blind_until == blind_until
    slow = (4.0,) * 20
    d, s = decide(snap(60.0, active=10, running=2, rate=7.9, ttft=slow), cfg, s)
    assert d.target_active == 10 and "ignored" in d.reason
    d, s = decide(snap(blind_until, active=10, running=2, rate=7.9, ttft=slow), cfg, s)
    assert d.target_active == min(16, math.ceil(10 * 4.0 / 2.0))


def test_symptom_upscale_waits_for_its_delay():
    cfg = AutoscaleConfig(upscale_delay_s=5.0, rate_upscale_delay_s=30.0)
    s = PolicyState()
    for t in (0.0, 2.0, 4.9):
        d, s = decide(snap(t, active=2, running=8, waiting=30, rate=3.0), cfg, s)
        assert d.target_active == 2, d.reason
    d, s = decide(snap(5.0, active=2, running=8, waiting=30, rate=3.0), cfg, s)
    # the backlog of test_queue_burst_sizes_the_fleet_by_the_backlog_left_when_new_replicas_arrive
    assert d.target_active == 5


def test_forecast_only_upscale_waits_for_the_rate_delay():
    cfg = AutoscaleConfig(upscale_delay_s=5.0, rate_upscale_delay_s=30.0)
    s = PolicyState()
    for t in range(0, 30, 5):
        d, s = decide(snap(float(t), active=4, running=2, rate=7.9), cfg, s)
        assert d.target_active == 4, d.reason
    d, s = decide(snap(30.0, active=4, running=2, rate=7.9), cfg, s)
    assert d.target_active == 10


def test_idle_scales_down_only_after_the_delay():
    cfg = AutoscaleConfig(downscale_delay_s=120.0, min_replicas=1)
    s = PolicyState()
    for t in range(0, 120):
        d, s = decide(snap(float(t), active=6), cfg, s)
        assert d.target_active == 6, (t, d.reason)
    d, s = decide(snap(120.0, active=6), cfg, s)
    assert d.target_active == 1 and "down 6→1" in d.reason


def test_no_scale_down_within_cooldown_of_a_scale_up():
    cfg = AutoscaleConfig(upscale_delay_s=0.0, rate_upscale_delay_s=0.0, downscale_delay_s=120.0,
                          downscale_cooldown_s=200.0)
    d, s = decide(snap(0.0, active=4, running=2, rate=7.9), cfg, PolicyState())
    assert d.target_active == 10
    for t in range(5, 200, 5):
        d, s = decide(snap(float(t), active=10), cfg, s)
        assert d.target_active == 10, (t, d.reason)
    d, s = decide(snap(200.0, active=10), cfg, s)
    assert d.target_active == 1


def test_scale_from_zero_on_pending_requests_ignores_the_upscale_delay():
    cfg = AutoscaleConfig(min_replicas=0, upscale_delay_s=30.0, rate_upscale_delay_s=60.0)
    d, s = decide(snap(0.0, pending=3), cfg, PolicyState(target_active=0))
    assert d.target_active == 1 and "from zero" in d.reason


def test_scale_to_zero_after_its_own_delay():
    cfg = AutoscaleConfig(min_replicas=0, downscale_delay_s=120.0, scale_to_zero_delay_s=30.0)
    s = PolicyState()
    for t in range(0, 30):
        d, s = decide(snap(float(t), active=1), cfg, s)
        assert d.target_active == 1
    d, s = decide(snap(30.0, active=1), cfg, s)
    assert d.target_active == 0


def test_rate_need_horizon_is_the_start_up_of_the_tier_used():
    trend = RateTrend(level=5.0, baseline=5.0, slope=0.02, variance=0.0, at=0.0)
    startup = AutoscaleConfig().startup_s
    cold_only = rate_need(trend, 7, 0.8, tier_sequence(0, 0), startup, 64)
    hot_first = rate_need(trend, 7, 0.8, tier_sequence(4, 0), startup, 64)
    # cold: the rate 180 s out, 5 + 0.02*180 = 8.6 rps, needs ceil(8.6/0.8) replicas
    assert cold_only == math.ceil((5.0 + 0.02 * 180.0) / 0.8) == 11
    # hot: 5 + 0.02*5 = 5.1 rps fits in the 7 we have
    assert hot_first == math.ceil((5.0 + 0.02 * 5.0) / 0.8) == 7


def test_plan_promotions_prefers_the_fastest_tier():
    s = snap(0.0, active=3, starting=1, standby=2, warm_ready=3)
    assert plan_promotions(s, 10) == {Tier.HOT: 2, Tier.WARM: 3, Tier.COLD: 1}
    assert plan_promotions(s, 4) == {}


def test_ramp_is_met_ahead_of_time_thanks_to_the_trend():
    def mean_lead(cfg: AutoscaleConfig) -> float:
        """Mean of (target - replicas the rate needs right now) once the trend has settled."""
        s, leads = PolicyState(), []
        for k in range(400):
            t = k * 5.0
            rate = 2 + 0.01 * t
            d, s = decide(snap(t, active=s.target_active or 3, running=2, rate=rate), cfg, s)
            if t > 300:
                leads.append(d.target_active - math.ceil(rate / 0.8))
        return sum(leads) / len(leads)

    # The cold start-up is 180 s: 0.01 rps/s x 180 s / 0.8 rps per replica = 2.25 replicas.
    with_trend = mean_lead(AutoscaleConfig(max_replicas=64))
    without = mean_lead(AutoscaleConfig(max_replicas=64, trend_z=1e9))
    assert with_trend >= 0.5
    assert with_trend >= without + 0.5


def _noisy_constant_run(cfg: AutoscaleConfig, seed: int, rate: float = 5.5) -> int:
    """One hour of Poisson arrivals seen through a 30 s sliding window; returns target changes."""
    rng = random.Random(seed)
    counts: list[int] = []
    s, last, changes = PolicyState(target_active=8), 8, 0
    for t in range(3600):
        # Poisson count in one second, by inversion
        k, p, u = 0, math.exp(-rate), rng.random()
        cum = p
        while u > cum:
            k += 1
            p *= rate / k
            cum += p
        counts = (counts + [k])[-30:]
        if t % 5:
            continue
        observed = sum(counts) / len(counts)
        d, s = decide(snap(float(t), active=last, running=3, rate=observed, ttft=(0.4,) * 10),
                      cfg, s)
        changes += d.target_active != last
        last = d.target_active
    return changes


@pytest.mark.parametrize("seed", range(4))
def test_no_flapping_under_noisy_constant_load(seed):
    assert _noisy_constant_run(AutoscaleConfig(), seed) <= 3
    # The same signals without hysteresis flap: the bound above is what the band buys.
    twitchy = AutoscaleConfig(downscale_utilization=0.79, upscale_delay_s=0.0,
                              rate_upscale_delay_s=0.0, downscale_delay_s=0.0,
                              downscale_cooldown_s=0.0, trend_z=0.0)
    assert _noisy_constant_run(twitchy, seed) > 10


def test_state_round_trips_through_json():
    _, s = decide(snap(0.0, active=4, running=2, rate=7.9), NO_DELAY, PolicyState())
    _, s = decide(snap(5.0, active=4, running=2, rate=8.3), NO_DELAY, s)
    again = PolicyState.from_dict(json.loads(json.dumps(s.to_dict())))
    assert again == s


def test_config_rejects_inverted_bounds_naming_the_fields():
    with pytest.raises(ValueError, match="min_replicas"):
        AutoscaleConfig(min_replicas=5, max_replicas=2)
    with pytest.raises(ValueError, match="downscale_utilization"):
        AutoscaleConfig(downscale_utilization=0.9)
    with pytest.raises(ValueError, match="unknown autoscale config field"):
        AutoscaleConfig.from_dict({"max_replica": 3})


replica_counts = st.integers(min_value=0, max_value=20)
step = st.fixed_dictionaries({
    "dt": st.floats(min_value=0.5, max_value=60.0),
    "active": replica_counts, "starting": st.integers(0, 5), "standby": st.integers(0, 3),
    "waiting": st.integers(0, 50), "running": st.integers(0, 32),
    "rate": st.floats(min_value=0.0, max_value=40.0),
    "ttft": st.lists(st.floats(min_value=0.0, max_value=30.0), max_size=12).map(tuple),
    "pending": st.integers(0, 5), "warm_ready": st.integers(0, 4),
    "kv": st.floats(min_value=0.0, max_value=1.0),
})


@settings(max_examples=150, deadline=None)
@given(min_r=st.integers(0, 4), extra=st.integers(0, 12), steps=st.lists(step, max_size=40))
def test_decisions_stay_in_bounds_and_downscales_respect_the_delay(min_r, extra, steps):
    cfg = AutoscaleConfig(min_replicas=min_r, max_replicas=max(1, min_r + extra),
                          upscale_delay_s=3.0, downscale_delay_s=20.0, downscale_cooldown_s=10.0)
    s, now, last_change_at, last = PolicyState(), 0.0, None, None
    for x in steps:
        now += x["dt"]
        sn = snap(now, **{k: v for k, v in x.items() if k != "dt"})
        d, s = decide(sn, cfg, s)
        floor = max(cfg.min_replicas, 1 if sn.pending_at_ingress else 0)
        assert floor <= d.target_active <= cfg.max_replicas
        hot, warm = d.target_standby[Tier.HOT], d.target_standby[Tier.WARM]
        assert 0 <= hot <= min(cfg.hot_standby_max, cfg.max_replicas - d.target_active)
        assert 0 <= warm <= cfg.warm_pool_max
        assert d.target_active + hot <= cfg.max_replicas
        if last is not None and d.target_active < last:
            assert last_change_at is None or now - last_change_at >= cfg.downscale_delay_s
        if last is None or d.target_active != last:
            last_change_at = now if last is not None else None
        last = d.target_active


def test_a_backlog_is_worth_a_hot_standby_that_a_cold_start_would_not_fix():
    # 1 active at 1 rps, 10 queued against a target of 2, 0.4 rps arriving. With a hot standby
    # (5 s away) the excess left then, 8 + (0.4 - 1) x 5 = 5, must drain within
    # max(TTFT target 2 s, 5 s) = 5 s: ceil(0.4 + 5 / 5) = 2 replicas, i.e. promote it.
    cfg = AutoscaleConfig(upscale_delay_s=0.0, rate_upscale_delay_s=0.0, target_queue_per_replica=2)
    d, _ = decide(snap(0.0, active=1, running=4, waiting=10, rate=0.4, standby=1), cfg, PolicyState())
    assert d.target_active == math.ceil(0.4 + (8 + (0.4 - 1.0) * 5.0) / 5.0) == 2
    assert "1 hot" in d.reason
    # Only a cold start (180 s) away, the same backlog is gone long before help could come.
    d, _ = decide(snap(0.0, active=1, running=4, waiting=10, rate=0.4), cfg, PolicyState())
    assert d.target_active == 1
