"""The Kubernetes baselines (autoscale/k8s_baselines.py), by hand: the HPA's tolerance, its
5-minute scale-down stabilization, its scale-up rate limit and starting pods; KEDA's polling,
activation from zero and cooldown to zero."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hbmserve.autoscale.k8s_baselines import (HpaConfig, HpaState, KedaConfig, KedaState,
                                              hpa_decide, keda_decide)
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.registry import POLICIES
from hbmserve.core.scaling import ReplicaSnapshot, ReplicaState, Snapshot

HPA = HpaConfig(min_replicas=1, max_replicas=16, target_queue_per_replica=4.0)


def snap(now: float, waiting: list[int], starting: int = 0, pending: int = 0) -> Snapshot:
    """One active replica per entry of `waiting` (its queue), plus `starting` ones."""
    reps = [ReplicaSnapshot(f"a{i}", ReplicaState.ACTIVE, w) for i, w in enumerate(waiting)]
    reps += [ReplicaSnapshot(f"s{i}", ReplicaState.STARTING) for i in range(starting)]
    return Snapshot(now=now, replicas=tuple(reps), pending_at_ingress=pending)


def hpa(now, waiting, state, starting=0, config=HPA):
    d, state = hpa_decide(snap(now, waiting, starting), config, state)
    return d.target_active, state


def test_hpa_scales_up_at_once_to_ceil_pods_times_ratio():
    # 2 pods, 20 waiting: 10 per pod against 4 -> ratio 2.5 -> ceil(2 x 2.5) = 5 at the first sync.
    n, _ = hpa(0.0, [10, 10], HpaState())
    assert n == 5


@pytest.mark.parametrize("waiting, want", [
    ([4, 4, 4, 5], 4),  # 17 / 4 pods = 4.25: ratio 1.0625, within 10 %: hold
    ([4, 4, 5, 5], 5),  # 18 / 4 = 4.5: ratio 1.125 -> ceil(4 x 1.125) = 5
    ([4, 4, 3, 3], 4),  # 14 / 4 = 3.5: ratio 0.875 -> ceil(3.5) = 4 = current
    ([3, 3, 3, 3], 3),  # 12 / 4 = 3: ratio 0.75 -> 3
])
def test_hpa_tolerance(waiting, want):
    n, _ = hpa(0.0, waiting, HpaState())
    assert n == want


def test_hpa_acts_only_on_its_15_s_syncs():
    _, state = hpa(0.0, [4, 4], HpaState())
    for t in (1.0, 14.0):
        n, state = hpa(t, [40, 40], state)
        assert n == 2
    n, state = hpa(15.0, [40, 40], state)
    assert n == 6  # desired 20, limited to max(2 + 4, 2 x 2) = 6 per 15 s


def test_hpa_scales_down_only_to_the_highest_recommendation_of_the_last_5_minutes():
    state = HpaState()
    n, state = hpa(0.0, [4] * 6, state)  # ratio 1: recommendation 6
    assert n == 6
    for t in range(15, 300, 15):
        queue = [2] * 6 if t == 150 else [0] * 6  # at 150 s: 12 / 6 = 2 -> recommendation 3
        n, state = hpa(float(t), queue, state)
        assert n == 6, t  # 6 (at 0 s) is inside every window up to 285 s
    # At 300 s the recommendation of 0 s has left the window (t > now - 300 is strict); the
    # highest left is 150 s's 3.
    n, state = hpa(300.0, [0] * 6, state)
    assert n == 3
    for t in range(315, 450, 15):
        n, state = hpa(float(t), [0] * 3, state)
        assert n == 3, t
    n, state = hpa(450.0, [0] * 3, state)  # 150 s's has left: only zeros, bounded by min 1
    assert n == 1


def test_hpa_scale_up_is_limited_to_4_pods_or_double_per_period():
    n, state = hpa(0.0, [100], HpaState())  # ratio 25 -> 25 desired; max(1 + 4, 1 x 2) = 5
    assert n == 5
    # 15 s later, 1 serving and 4 starting with 100 waiting: starting pods count as empty,
    # ratio 100 / 5 / 4 = 5 -> 25; the period's start is 5 (the +4 at 0 s is outside
    # (0, 15]): max(5 + 4, 5 x 2) = 10.
    n, state = hpa(15.0, [100], state, starting=4)
    assert n == 10
    assert state.events == ((15.0, 5),)


def test_hpa_counts_starting_pods_at_the_target_on_a_scale_down():
    # 1 serving with 3 waiting (ratio 0.75 alone -> 1) and 1 starting counted at the target:
    # (3 + 4) / 2 / 4 = 0.875 -> ceil(1.75) = 2 = current: the starting pod is kept.
    n, _ = hpa(0.0, [3], HpaState(spec=2), starting=1)
    assert n == 2
    # 1 serving with 5 waiting (ratio 1.25) and 3 starting counted empty: 5 / 4 / 4 = 0.31, the
    # direction flips: hold.
    n, _ = hpa(0.0, [5], HpaState(spec=4), starting=3)
    assert n == 4


def test_hpa_never_scales_to_zero_and_stays_disabled_at_zero():
    config = POLICIES["k8s-hpa"].make_config(AutoscaleConfig(min_replicas=0, max_replicas=4), None)
    assert config.min_replicas == 1 and config.target_queue_per_replica == 4.0
    n, _ = hpa(0.0, [0, 0], HpaState(), config=config)
    assert n == 1
    d, _ = hpa_decide(Snapshot(now=0.0, replicas=(), pending_at_ingress=9), config, HpaState())
    assert d.target_active == 0 and "disabled" in d.reason


KEDA = KedaConfig(min_replicas=0, max_replicas=10, target_queue_length=4.0)


def keda(now, waiting, state, pending=0, config=KEDA):
    d, state = keda_decide(snap(now, waiting, pending=pending), config, state)
    return d.target_active, state, d.reason


def test_keda_activates_from_zero_only_on_a_poll():
    n, state, _ = keda(0.0, [], KedaState())  # polled: nothing waiting, nothing to do
    assert n == 0
    n, state, _ = keda(10.0, [], state, pending=5)  # between polls (every 30 s)
    assert n == 0
    n, state, why = keda(30.0, [], state, pending=5)
    assert n == 1 and "activated" in why


def test_keda_scales_to_zero_after_the_cooldown_since_the_last_active_poll():
    state = replace(KedaState(), hpa=HpaState(spec=1))
    n, state, _ = keda(0.0, [2], state)  # active poll; its HPA: ceil(2 / 4) = 1
    assert n == 1 and state.last_active_at == 0.0
    for t in range(1, 300):
        n, state, _ = keda(float(t), [0], state)
        assert n == 1, t  # the HPA's min is 1; polls at 30..270 s are inactive
    n, state, why = keda(300.0, [0], state)  # 300 s since the last active poll
    assert n == 0 and "cooldown" in why
    n, state, _ = keda(301.0, [], state, pending=1)
    assert n == 0  # next poll at 330 s
    n, state, _ = keda(330.0, [], state, pending=1)
    assert n == 1


def test_keda_between_one_and_n_is_its_hpa_on_queue_length():
    config = KedaConfig(min_replicas=1, max_replicas=10, target_queue_length=4.0)
    assert config.hpa.scale_down_stabilization_s == 300.0 and config.hpa.min_replicas == 1
    state = replace(KedaState(), hpa=HpaState(spec=2))
    # External metric, AverageValue: 20 waiting / 4 = 5 (ratio 20 / (4 x 2) = 2.5).
    n, state, why = keda(0.0, [10, 10], state, config=config)
    assert n == 5 and "keda (its HPA)" in why
    # 4 x 5 = 20 +- 10 %: 21 waiting is within tolerance; never to zero with min 1.
    n, state, _ = keda(15.0, [5, 5, 5, 6], state, config=config)
    assert n == 5
    for t in range(30, 700, 15):
        n, state, _ = keda(float(t), [0] * n, state, config=config)
    assert n == 1
