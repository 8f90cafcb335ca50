"""Baseline policies: Ray Serve's default (by hand and against the installed Ray's own
functions), static peak, queue threshold, and the registry."""

from __future__ import annotations

import math

import pytest

from hbmserve.autoscale import baselines as bl
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.oracle import OracleConfig
from hbmserve.autoscale.registry import POLICIES
from hbmserve.core.scaling import ReplicaSnapshot, ReplicaState, ScaleDecision, Snapshot


def snap(now, *, active=0, starting=0, waiting=0, running=0, pending=0) -> Snapshot:
    reps = [ReplicaSnapshot(f"a{i}", ReplicaState.ACTIVE, waiting, running) for i in range(active)]
    reps += [ReplicaSnapshot(f"s{i}", ReplicaState.STARTING) for i in range(starting)]
    return Snapshot(now=now, replicas=tuple(reps), pending_at_ingress=pending)


BOUNDED = bl.RayDefaultConfig(min_replicas=1, max_replicas=10)


def test_ray_default_upscales_to_ongoing_over_target_after_30s():
    state = bl.RayDefaultState()
    # 3 replicas x (4 running + 2 queued) = 18 ongoing; 18 / target_ongoing_requests 2 = 9
    for t in range(0, 30):
        d, state = bl.ray_default_decide(snap(float(t), active=3, running=4, waiting=2),
                                         BOUNDED, state)
        assert d.target_active == 3, (t, d.reason)
    d, state = bl.ray_default_decide(snap(30.0, active=3, running=4, waiting=2), BOUNDED, state)
    assert d.target_active == 18 / 2 == 9


def test_ray_default_averages_what_was_pushed_over_the_window():
    cfg = bl.RayDefaultConfig(min_replicas=1, max_replicas=10, upscale_delay_s=0.0)
    state = bl.RayDefaultState(target_num_replicas=3)
    # Points are recorded every min(30 * 0.2, 10) = 6 s and pushed every 10 s.
    d, state = bl.ray_default_decide(snap(0.0, active=3, running=1, waiting=1), cfg, state)
    assert state.pushed == ((0.0, 6.0),)
    # t=6: a point of 20 is recorded but not pushed yet: the controller still sees 6 ongoing.
    d, state = bl.ray_default_decide(snap(6.0, active=4, running=4, waiting=1), cfg, state)
    assert d.target_active == 3  # 6 / 2 = 3 desired = current
    d, state = bl.ray_default_decide(snap(10.0, active=4, running=4, waiting=1), cfg, state)
    # pushed [(0, 6), (6, 20)], last holds until now=10: (6*6 + 20*4) / 10 = 11.6 ongoing
    mean = (6 * 6 + 20 * 4) / 10
    assert d.target_active == math.ceil(4 + 1.0 * (mean / 2 - 4)) == 6


def test_ray_default_downscale_waits_600s_and_never_below_min():
    state = bl.RayDefaultState(target_num_replicas=5)
    for t in range(0, 600, 10):
        d, state = bl.ray_default_decide(snap(float(t), active=5), BOUNDED, state)
        assert d.target_active == 5
    d, state = bl.ray_default_decide(snap(600.0, active=5), BOUNDED, state)
    assert d.target_active == 1  # desired 0, clamped to max(1, .) then to min_replicas


def test_ray_default_cold_start_bypasses_the_delay():
    cfg = bl.RayDefaultConfig(min_replicas=0, max_replicas=10)
    d, _ = bl.ray_default_decide(snap(0.0, pending=5), cfg,
                                 bl.RayDefaultState(target_num_replicas=0))
    assert d.target_active == 1 and "cold start" in d.reason


def test_ray_default_scales_one_to_zero_after_its_delay():
    cfg = bl.RayDefaultConfig(min_replicas=0, max_replicas=10, downscale_to_zero_delay_s=60.0)
    state = bl.RayDefaultState(target_num_replicas=1)
    for t in range(0, 60, 5):
        d, state = bl.ray_default_decide(snap(float(t), active=1), cfg, state)
        assert d.target_active == 1
    d, state = bl.ray_default_decide(snap(60.0, active=1), cfg, state)
    assert d.target_active == 0


# --- the other baselines and the registry ---------------------------------------------------


def test_static_peak_holds_its_count_and_sizes_for_the_peak():
    cfg = POLICIES["static-peak"].make_config(AutoscaleConfig(), 7.9)
    assert cfg.replicas == math.ceil(7.9 / (1.0 * 0.8)) == 10
    d, _ = bl.static_peak_decide(snap(0.0, active=2, waiting=50), cfg, bl.StaticPeakState())
    assert d.target_active == 10
    assert POLICIES["static-peak"].make_config(AutoscaleConfig(), None).replicas == 16


def test_queue_threshold_steps_by_one_with_a_cooldown():
    cfg = bl.QueueThresholdConfig(min_replicas=1, max_replicas=4, scale_up_queue=4.0,
                                  scale_down_queue=0.5, cooldown_s=60.0)
    s = bl.QueueThresholdState()
    d, s = bl.queue_threshold_decide(snap(0.0, active=2, waiting=9), cfg, s)
    assert d.target_active == 3
    d, s = bl.queue_threshold_decide(snap(30.0, active=3, waiting=9), cfg, s)
    assert d.target_active == 3  # cooling down
    d, s = bl.queue_threshold_decide(snap(60.0, active=3, waiting=9), cfg, s)
    assert d.target_active == 4
    d, s = bl.queue_threshold_decide(snap(120.0, active=4, waiting=9), cfg, s)
    assert d.target_active == 4  # max
    d, s = bl.queue_threshold_decide(snap(180.0, active=4), cfg, s)
    assert d.target_active == 3


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_registered_policy_decides_within_bounds(name):
    entry = POLICIES[name]
    if entry.clairvoyant:  # the oracle: a schedule its driver plans from the whole trace
        with pytest.raises(ValueError, match="planned from the whole trace"):
            entry.make_config(AutoscaleConfig(min_replicas=1, max_replicas=6), 3.0)
        config = OracleConfig(((0.0, 2), (80.0, 6), (160.0, 1)))
    else:
        config = entry.make_config(AutoscaleConfig(min_replicas=1, max_replicas=6), 3.0)
    state = entry.initial_state()
    for t, waiting in enumerate([0, 40, 40, 40, 0, 0]):
        d, state = entry.decide(snap(float(t * 40), active=2, running=3, waiting=waiting),
                                config, state)
        assert isinstance(d, ScaleDecision) and d.reason
        assert 1 <= d.target_active <= 6
