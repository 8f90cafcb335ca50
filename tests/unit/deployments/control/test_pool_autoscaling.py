"""A disaggregated model's two autoscaled pools, one decision (deployments/control/pool_autoscaling.py).

The translation is fed real Serve AutoscalingContexts (test_slot_autoscaling's builders): the
prefill pool's as the leader sees it, published as slot stats and merged back (`model_context`),
the decode pool's as Serve hands it. The policy objects run with the Ray KV replaced by a dict.
"""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.pools.pools_policy import PoolsConfig, PoolsSnapshot, PoolsState, decide_pools, pool_config
from hbmserve.core.records import SlotStats
from hbmserve.deployments.control import autoscaling as sa
from hbmserve.deployments.control import pool_autoscaling as pa
from hbmserve.deployments.control.slot_autoscaling import model_context, stats_of
from tests.unit.deployments.control.test_slot_autoscaling import NOW, context

PREFILL, DECODE = "engine-m-prefill", "engine-m-decode"
BASE = AutoscaleConfig(min_replicas=1, max_replicas=4, replica_capacity_rps=10.0, upscale_delay_s=0.0,
                       target_queue_per_replica=8.0)
CONFIG = PoolsConfig(prefill=pool_config(BASE, decode=False), decode=pool_config(BASE, decode=True),
                     prefill_tokens_per_s=4_000.0)
MEAN = 3_000.0  # the configured prompt mean, before enough requests finished
# Per replica: (waiting, running, arrival rps, TTFT p95 points).
PREFILL_LOAD = {"p0": (5.0, 1.0, 2.0, ((NOW - 2, 1.5),)), "p1": (2.0, 1.0, 1.0, ())}
DECODE_LOAD = {"d0": (0.0, 6.0, 2.0, ()), "d1": (0.0, 5.0, 1.0, ())}


def prefill_context(load=PREFILL_LOAD, extra: dict | None = None):
    """The prefill pool as the leader rebuilds it: its policy's published stats, merged."""
    stats = stats_of(context(PREFILL, list(load), target=len(load), load=load), 0, BASE.look_back_s)
    if extra:
        stats = replace(stats, replicas={r: {**s, **extra} for r, s in stats.replicas.items()})
    return model_context([stats], NOW, {}, "m", PREFILL)[0]


def decode_context(policy_state=None):
    return context(DECODE, list(DECODE_LOAD), target=2, load=DECODE_LOAD, policy_state=policy_state)


def test_the_snapshot_counts_the_prompt_backlog_in_tokens_and_decides_both_pools_at_once(monkeypatch):
    seen = []
    monkeypatch.setattr(pa, "decide_pools", lambda s, c, st: seen.append(s) or decide_pools(s, c, st))
    out = pa.decide_pools_from_contexts(prefill_context(), decode_context(), CONFIG, MEAN)
    (snap,) = seen
    # 5 + 2 waiting prompts of 3,000 tokens; 2 + 1 arrivals/s of them.
    assert (snap.prompt_backlog_tokens, snap.prompt_tokens_rps) == (21_000, 9_000.0)
    assert snap.prefill.ttft_samples_s == (1.5,) and snap.decode.arrival_rate_rps == 3.0
    want, _ = decide_pools(PoolsSnapshot(snap.prefill, snap.decode, 21_000, 9_000.0), CONFIG, PoolsState())
    # 21,000 tokens over 2 x 4,000 tokens/s take 2.6 s, past half the 2 s TTFT target: the backlog
    # asks for (9,000 + 21,000 / 180 s, a cold start, to drain) / 4,000 -> 3 prefill replicas,
    # where the rate (3 rps at 10 per replica) and the queue (3.5 per replica, under 8) ask for
    # fewer; decode holds.
    assert (out.prefill.target_active, out.decode.target_active) == (want.prefill.target_active,
                                                                     want.decode.target_active) == (3, 2)
    assert out.reason == want.reason and "prompt backlog 21,000 tokens" in out.reason
    assert (out.prefill.serve_target, out.decode.serve_target) == (3, 2)


def test_the_observed_prompt_mean_replaces_the_configured_one_once_enough_requests_finished(monkeypatch):
    seen = []
    monkeypatch.setattr(pa, "decide_pools", lambda s, c, st: seen.append(s) or decide_pools(s, c, st))
    lengths = {sa.STAT_LENGTH_SAMPLES: ((NOW - 1, 10.0),), sa.STAT_PROMPT_TOKENS: ((NOW - 1, 500.0),),
               sa.STAT_OUTPUT_TOKENS: ((NOW - 1, 1.0),)}
    pa.decide_pools_from_contexts(prefill_context(extra=lengths), decode_context(), CONFIG, MEAN)
    assert seen[-1].prompt_backlog_tokens == 7 * 500  # 2 replicas x 10 requests: enough
    few = {**lengths, sa.STAT_LENGTH_SAMPLES: ((NOW - 1, 5.0),)}
    pa.decide_pools_from_contexts(prefill_context(extra=few), decode_context(), CONFIG, MEAN)
    assert seen[-1].prompt_backlog_tokens == 7 * 3_000


def test_each_pool_gets_its_record_with_the_joint_reason_its_roles_and_the_state_carries_over():
    out = pa.decide_pools_from_contexts(prefill_context(), decode_context(), CONFIG, MEAN)
    for record, replicas in ((out.prefill, ("p0", "p1")), (out.decode, ("d0", "d1"))):
        assert record.reason.split(" ", 1)[0] in ("up", "down", "hold"), "its own action leads"
        assert f" | {out.reason}" in record.reason and " | prefill: " in record.reason
        assert " | decode: " in record.reason
        assert record.active_replicas == replicas and record.standby_replicas == ()
        assert dict(record.target_standby) == {t: 0 for t in record.target_standby}
    state = out.policy_state
    assert sa.decision_in(state["prefill"]).to_dict() == out.prefill.to_dict()
    assert sa.decision_in(state["decode"]).to_dict() == out.decode.to_dict()
    assert PoolsState.from_dict(state[pa.POOLS_STATE_KEY]).prefill.last_scale_up_at == NOW
    # Next tick, one prefill replica more running: it is promoted, the old ones keep serving.
    grown = {**PREFILL_LOAD, "p2": (0.0, 0.0, 0.0, ())}
    again = pa.decide_pools_from_contexts(prefill_context(grown), decode_context(state), CONFIG, MEAN)
    assert again.prefill.active_replicas == ("p0", "p1", "p2")


class FakeStore:
    """The Ray KV the two pool policies share."""

    def __init__(self, monkeypatch):
        self.stats: list[SlotStats] = []
        self.decisions: dict[str, object] = {}
        self.logged: list[str] = []
        monkeypatch.setattr(pa, "publish_slot_stats", lambda app, dep, s: self.stats.append(s))
        monkeypatch.setattr(pa, "slot_stats", lambda app, dep, now: self.stats[-1:])
        monkeypatch.setattr(pa, "latest_decision", lambda app, dep: self.decisions.get(dep))
        monkeypatch.setattr(pa, "ingress_demand", lambda app, dep: None)
        monkeypatch.setattr(sa.DecisionLog, "publish",
                            lambda _, app, dep, d, changed=False: self.decisions.__setitem__(dep, d))


def test_the_decode_pool_leads_and_the_prefill_pool_follows(monkeypatch, caplog):
    store = FakeStore(monkeypatch)
    follower = pa.PoolsAutoscalingPolicy(PREFILL, BASE.look_back_s)
    leader = pa.PoolsAutoscalingPolicy(PREFILL, BASE.look_back_s, pools=CONFIG.to_dict(), prompt_mean_tokens=MEAN)
    # Before the prefill pool reported, the leader holds; before any decision the follower does.
    assert leader(decode_context()) == (2, {})
    prefill_ctx = context(PREFILL, list(PREFILL_LOAD), target=2, load=PREFILL_LOAD)
    assert follower(prefill_ctx) == (2, {}) and store.stats[-1].slot == 0
    with caplog.at_level("INFO", logger="ray.serve"):
        target, state = leader(decode_context())
    assert target == 2 and set(store.decisions) == {PREFILL, DECODE}
    joint = store.decisions[PREFILL].reason.split(" | ", 1)[1]
    assert joint.split("; ", 1)[0].startswith("prefill ") and joint in store.decisions[DECODE].reason
    assert [r.getMessage().count("prefill up") for r in caplog.records] == [1]
    assert follower(prefill_ctx)[0] == store.decisions[PREFILL].serve_target == 3
    # An unchanged plan is published again but not logged again.
    caplog.clear()
    with caplog.at_level("INFO", logger="ray.serve"):
        leader(decode_context(state))
    assert not caplog.records


def test_the_leader_needs_a_prompt_mean():
    with pytest.raises(ValueError, match="prompt_mean_tokens must be > 0"):
        pa.PoolsAutoscalingPolicy(PREFILL, 30.0, pools=CONFIG.to_dict())


def test_the_pools_config_round_trips_as_plain_data():
    assert PoolsConfig.from_dict(CONFIG.to_dict()) == CONFIG
    assert asdict(PoolsConfig.from_dict(CONFIG.to_dict()).decode) == asdict(CONFIG.decode)
