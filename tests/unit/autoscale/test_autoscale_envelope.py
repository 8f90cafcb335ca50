"""The burst envelope (autoscale/envelope.py): what it remembers, what it holds, and what
`decide` does with it: lulls between bursts keep the burst's replicas, a steady noisy load
keeps none more, and the memory fades."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hbmserve.autoscale.envelope import BurstEnvelope, envelope_floor, peak_misses
from hbmserve.autoscale.policy import PolicyState, decide
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.core.scaling import ReplicaSnapshot, ReplicaState, Snapshot

BUCKET, MEMORY = 180.0, 1800.0


def _observe(rates: list[float], env: BurstEnvelope | None = None, start: float = 0.0
             ) -> BurstEnvelope:
    env = env or BurstEnvelope(bucket_started_at=start)
    for i, r in enumerate(rates):
        env = env.observe(start + i, r, BUCKET, MEMORY)
    return env


def _floor(env: BurstEnvelope, capacity: float = 5.0, miss_usd: float = 0.01) -> int:
    return envelope_floor(env, replica_rps=capacity, replica_usd_per_hour=10.0,
                          slo_miss_usd=miss_usd, bucket_s=BUCKET, length_s=90.0, ttft_s=2.0,
                          max_replicas=16).replicas


def test_a_rise_is_measured_from_the_lowest_rate_of_this_bucket_and_the_one_before():
    # A lull at 1 rps, then a burst to 15 rps that starts 10 s before the bucket ends.
    env = _observe([1.0] * 170 + [15.0] * 60)
    assert env.rises_rps == (14.0,)  # the first bucket closed with the burst's start in it
    assert env.open_rise_rps == 14.0  # from the previous bucket's lull: seen whole
    assert env.base_rps == 1.0
    assert max(env.peaks_rps) == 15.0


def test_old_buckets_are_forgotten_after_the_memory():
    env = _observe([1.0] * 100 + [15.0] * 60 + [1.0] * 200)
    assert max(env.rises_rps + (env.open_rise_rps,)) == 14.0
    env = _observe([1.0] * int(MEMORY + 2 * BUCKET), env, start=360.0)
    assert len(env.rises_rps) == MEMORY / BUCKET
    assert max(env.rises_rps + (env.open_rise_rps,)) == 0.0


def test_nothing_is_observed_before_the_bucket_starts():
    env = BurstEnvelope(bucket_started_at=30.0)
    assert env.observe(10.0, 50.0, BUCKET, MEMORY) == env


def test_a_peak_that_brushes_past_capacity_misses_nothing_and_a_big_one_most_of_its_length():
    assert peak_misses(4.0, 5.0, 90.0, 2.0) == 0.0
    # 5.2 over 5: the queue needs 50 s to hold 2 s of work; the remaining 40 s miss.
    assert peak_misses(5.2, 5.0, 90.0, 2.0) == pytest.approx(5.2 * 40.0)
    assert peak_misses(5.1, 5.0, 90.0, 2.0) == 0.0  # 100 s: longer than the peak
    assert peak_misses(20.0, 5.0, 90.0, 2.0) == pytest.approx(20.0 * (90.0 - 10.0 / 15.0))
    assert peak_misses(3.0, 0.0, 90.0, 2.0) == 270.0


def test_bursts_in_the_memory_hold_their_replicas_and_noise_holds_none():
    bursty = _observe(([0.5] * 240 + [14.0] * 90) * 5)
    assert _floor(bursty) == 3  # 14.5 rps at 5 rps a replica
    steady = _observe([4.0 + (0.9 if i % 60 < 10 else 0.0) for i in range(1800)])
    assert _floor(steady) == 1  # a peak of 4.9 fits in one
    # The price of a miss decides: at a hundredth of it, the rare burst is not worth holding.
    rare = _observe([0.5] * 1500 + [14.0] * 60 + [0.5] * 240)
    assert _floor(rare) == 3
    assert _floor(rare, miss_usd=0.0001) == 0


def test_the_envelope_survives_the_policy_state_round_trip_through_json():
    env = _observe([1.0] * 100 + [9.0] * 100)
    state = PolicyState(target_active=3, envelope=env)
    back = PolicyState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert back == state


CAP = 5.0
CONFIG = AutoscaleConfig(replica_capacity_rps=CAP, min_replicas=1, max_replicas=8,
                         tpot_p95_target_s=0.1, downscale_delay_s=60.0)


def _snap(now: float, active: int, rate: float, waiting: int = 0) -> Snapshot:
    reps = tuple(ReplicaSnapshot(f"r{i}", ReplicaState.ACTIVE, waiting if i == 0 else 0, 1, 0.1)
                 for i in range(active))
    return Snapshot(now=now, replicas=reps, ttft_samples_s=(0.3,) * 20,
                    tpot_samples_s=(0.03,) * 20, arrival_rate_rps=rate)


def _drive(config: AutoscaleConfig, rates: list[float], active: int
           ) -> tuple[list[int], str, list[int]]:
    """decide over one rate per second; the fleet follows the target at once (the test is of
    what is asked for, not of start-up). The targets, the last reason, the burst holds."""
    state, targets, reason, holds = PolicyState(), [], "", []
    for t, rate in enumerate(rates):
        decision, state = decide(_snap(float(t), active, rate), config, state)
        active = max(1, decision.target_active)
        targets.append(decision.target_active)
        holds.append(decision.burst_hold)
        reason = decision.reason
    return targets, reason, holds


def test_in_the_lulls_between_bursts_decide_keeps_the_burst_s_replicas():
    rates = ([0.5] * 200 + [14.0] * 100) * 4
    with_envelope, reason, holds = _drive(CONFIG, rates, 3)
    without, _, off = _drive(replace(CONFIG, burst_memory_s=0.0), rates, 3)
    # Bursts at 200-300, 500-600, 800-900, 1100-1200 s; the lulls after the first, once a
    # scale-down's delays have passed.
    lulls = [t for t in range(475, 1200) if 175 <= t % 300 < 200]
    assert min(with_envelope[t] for t in lulls) >= 3
    assert max(without[t] for t in lulls) <= 1  # v2 lets the burst's replicas go in every lull
    assert "burst envelope: peak" in reason and "hold 3" in reason
    assert holds[-1] == 3 and set(off) == {0}  # what the live gauge reports


def test_a_steady_noisy_load_holds_no_more_with_the_envelope():
    rates = [4.0 + (0.8 if (i // 7) % 3 == 0 else -0.5) for i in range(1500)]
    with_envelope, _, _ = _drive(CONFIG, rates, 1)
    without, _, _ = _drive(replace(CONFIG, burst_memory_s=0.0), rates, 1)
    assert with_envelope == without


def test_a_bad_envelope_setting_names_its_field():
    with pytest.raises(ValueError, match="burst_memory_s"):
        AutoscaleConfig(burst_memory_s=-1.0)
    with pytest.raises(ValueError, match="burst_bucket_s"):
        AutoscaleConfig(burst_bucket_s=0.0)
    with pytest.raises(ValueError, match="burst_length_s"):
        AutoscaleConfig(burst_length_s=0.0)
