"""The two-pool policy (issue 23 req 5): one decision, one reason, each pool on its own signals."""

from __future__ import annotations

import pytest

from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.pools.pools_policy import (PoolsConfig, PoolsSnapshot, PoolsState, backlog_need,
                                                   decide_pools, kv_need, pool_config)
from hbmserve.core.scaling import ReplicaSnapshot, ReplicaState, Snapshot, Tier

BASE = AutoscaleConfig(ttft_p95_target_s=1.0, tpot_p95_target_s=0.05, replica_capacity_rps=2.0,
                       max_replicas=12, upscale_delay_s=5.0, downscale_delay_s=30.0, downscale_cooldown_s=30.0,
                       hot_standby_max=2, warm_pool_max=2)
CONFIG = PoolsConfig(prefill=pool_config(BASE, decode=False), decode=pool_config(BASE, decode=True),
                     prefill_tokens_per_s=10_000.0)


def pool(now: float, n: int, *, waiting: int = 0, running: int = 2, kv: float = 0.3, rps: float = 2.0,
         ttft: tuple[float, ...] = (), tpot: tuple[float, ...] = ()) -> Snapshot:
    replicas = tuple(ReplicaSnapshot(f"r{i}", ReplicaState.ACTIVE, waiting=waiting, running=running, kv_usage=kv)
                     for i in range(n))
    return Snapshot(now=now, replicas=replicas, ttft_samples_s=ttft, tpot_samples_s=tpot, arrival_rate_rps=rps)


def run(make, seconds: int, state: PoolsState | None = None):
    """Decide once a second for `seconds`; `make(now)` gives the snapshot."""
    state = state or PoolsState()
    decision = None
    for now in range(seconds):
        decision, state = decide_pools(make(float(now)), CONFIG, state)
    return decision, state


def test_needs_in_tokens_and_kv() -> None:
    # 40k tokens on 2 replicas of 10k tokens/s clear in 2 s: over a 0.5 s budget.
    assert backlog_need(40_000, 2, 5_000.0, 10_000.0, 0.5, 10.0) == 1  # (5k + 4k)/10k -> 1
    assert backlog_need(400_000, 2, 5_000.0, 10_000.0, 0.5, 10.0) == 5  # (5k + 40k)/10k
    assert backlog_need(5_000, 2, 5_000.0, 10_000.0, 0.5, 10.0) == 0  # clears in 0.25 s
    assert kv_need(0.95, 4, 0.9) == 5 and kv_need(0.5, 4, 0.9) == 0 and kv_need(0.99, 0, 0.9) == 0


def test_a_prompt_backlog_grows_prefill_and_holds_decode() -> None:
    def snap(now: float) -> PoolsSnapshot:
        return PoolsSnapshot(pool(now, 2, waiting=6), pool(now, 4, kv=0.2), prompt_backlog_tokens=300_000,
                             prompt_tokens_rps=20_000.0)

    decision, _ = run(snap, 8)
    # The arrivals alone fill the 2 replicas; a cold start away, the backlog drains within one
    # more start-up (180 s): (20k + 300k / 180) / 10k -> 3.
    assert decision.prefill.target_active == 3
    assert decision.decode.target_active == 4
    assert "prefill hold 3" in decision.reason and "decode held" in decision.reason
    assert "prompt backlog 300,000 tokens" in decision.reason
    assert decision.prefill.target_standby[Tier.HOT] == 0 and decision.decode.target_standby[Tier.WARM] == 0


def test_full_kv_grows_decode_not_prefill() -> None:
    def snap(now: float) -> PoolsSnapshot:
        return PoolsSnapshot(pool(now, 2, waiting=0, running=1), pool(now, 4, kv=0.99, running=30))

    decision, _ = run(snap, 8)
    assert decision.decode.target_active == 5  # 4 x 0.99 / 0.9
    assert decision.prefill.target_active == 2
    assert "kv 0.99 vs 0.9 (need 5)" in decision.reason


def test_ttft_misses_go_to_the_pool_that_causes_them() -> None:
    slow = tuple([3.0] * 20)  # p95 TTFT 3 s over a 1 s target

    def decode_queueing(now: float) -> PoolsSnapshot:
        return PoolsSnapshot(pool(now, 2, running=1, ttft=slow), pool(now, 4, waiting=10, kv=0.85, running=30,
                                                                              rps=10.0))

    decision, _ = run(decode_queueing, 8)
    assert decision.prefill.target_active == 2
    assert decision.decode.target_active > 4
    assert "TTFT charged to decode" in decision.reason

    def prefill_slow(now: float) -> PoolsSnapshot:
        return PoolsSnapshot(pool(now, 2, running=1, ttft=slow), pool(now, 4, kv=0.3))

    decision, _ = run(prefill_slow, 8)
    assert decision.prefill.target_active == 4  # 2 x 3/1, at most 2x a step
    assert decision.decode.target_active == 4
    assert "TTFT charged" not in decision.reason


def test_tpot_grows_decode_only() -> None:
    slow = tuple([0.1] * 20)  # 100 ms over 50 ms

    def snap(now: float) -> PoolsSnapshot:
        return PoolsSnapshot(pool(now, 2, running=1), pool(now, 3, kv=0.5, running=40, tpot=slow))

    decision, _ = run(snap, 8)
    assert decision.decode.target_active == 6 and decision.prefill.target_active == 2
    assert "TPOT not a signal" in decision.prefill.reason


def test_decode_forecast_sees_arrivals_at_the_prefill_pool() -> None:
    # 20 rps enter the prefill pool; the decode pool has seen only 2 so far. At 2 rps per replica
    # and 0.8 utilisation the decode pool needs 13, capped at max_replicas 12, ordered once
    # the forecast has lasted rate_upscale_delay_s.
    def snap(now: float) -> PoolsSnapshot:
        return PoolsSnapshot(pool(now, 12, rps=20.0, running=0), pool(now, 2, rps=2.0, running=4))

    decision, _ = run(snap, 40)
    assert decision.decode.target_active == 12


def test_idle_pools_shrink_after_the_delay_and_state_round_trips() -> None:
    def snap(now: float) -> PoolsSnapshot:
        return PoolsSnapshot(pool(now, 3, running=0, rps=0.0, kv=0.0), pool(now, 4, running=0, rps=0.0, kv=0.0))

    decision, state = run(snap, 70)
    assert decision.prefill.target_active < 3 and decision.decode.target_active < 4
    assert PoolsState.from_dict(state.to_dict()) == state
    assert PoolsState.from_dict(None) == PoolsState()


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="kv_target"):
        PoolsConfig(CONFIG.prefill, CONFIG.decode, 1000.0, kv_target=1.5)
    with pytest.raises(ValueError, match="prefill_tokens_per_s"):
        PoolsConfig(CONFIG.prefill, CONFIG.decode, 0.0)
