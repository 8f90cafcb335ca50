"""The Ray Serve adapter, fed a hand-built ray.serve.config.AutoscalingContext.

AutoscalingContext's constructor takes plain values, so the real class is used; no Ray
cluster is started. The last test runs the policy through Serve's own wrapper
(autoscaling_policy._apply_autoscaling_config) exactly as the controller would.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from hbmserve.deployments.control import autoscaling as sa
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.policy import PolicyState, decide
from hbmserve.core.records import IngressDemand, RecordError
from hbmserve.core.scaling import ReplicaState, Tier
from hbmserve.deployments.apps.autoscaling_options import serve_autoscaling_config
from hbmserve.deployments.wire.autoscaling_stats import autoscaling_stats

ray_config = pytest.importorskip("ray.serve.config", reason="ray[serve] not installed")
ray_common = pytest.importorskip("ray.serve._private.common", reason="ray[serve] not installed")
ray_policy = pytest.importorskip("ray.serve.autoscaling_policy", reason="ray[serve] not installed")
ray_state = pytest.importorskip("ray.serve._private.autoscaling_state",
                                reason="ray[serve] not installed")

NOW = 1_000.0
DEP = ray_common.DeploymentID(name="engine", app_name="app")


def rid(name: str):
    return ray_common.ReplicaID(unique_id=name, deployment_id=DEP)


def series(*points: tuple[float, float]):
    return [ray_common.TimeStampedValue(t, v) for t, v in points]


def context(*, config=None, policy_state=None, current=2, target=4, queued=2.4, now=NOW):
    r1, r2 = rid("r1"), rid("r2")
    raw = {
        sa.STAT_WAITING: {r1: series((now - 3, 1.0), (now - 1, 6.0)), r2: series((now - 1, 0.0))},
        sa.STAT_RUNNING: {r1: series((now - 1, 8.0)), r2: series((now - 1, 0.0))},
        sa.STAT_KV_USAGE: {r1: series((now - 1, 0.75)), r2: series((now - 1, 0.0))},
        sa.STAT_ARRIVAL_RPS: {r1: series((now - 1, 3.5)), r2: series((now - 1, 0.0))},
        # one point older than the 30 s look-back, two inside
        sa.STAT_TTFT_P95_S: {r1: series((now - 45, 9.0), (now - 20, 1.5), (now - 1, 2.5)),
                             r2: series((now - 2, 7.0))},
        sa.STAT_TPOT_P95_S: {r1: series((now - 40, 0.5), (now - 2, 0.04))},
    }
    # Only the running-requests key is aggregated by Serve itself for r1; raw wins when present.
    aggregated = {sa.STAT_WAITING: {r1: 3.0, r2: 0.0}}
    return ray_config.AutoscalingContext(
        deployment_id=DEP, deployment_name="engine", app_name="app",
        current_num_replicas=current, target_num_replicas=target, running_replicas=[r1, r2],
        total_num_requests=17.0, total_queued_requests=queued,
        aggregated_metrics=aggregated, raw_metrics=lambda: raw,
        capacity_adjusted_min_replicas=1, capacity_adjusted_max_replicas=16,
        policy_state=policy_state if policy_state is not None else {},
        last_scale_up_time=None, last_scale_down_time=None, current_time=now, config=config)


def test_snapshot_from_a_real_context():
    demand = IngressDemand(held=2, refused_rps=1.25, at=NOW)
    s = sa.snapshot_from_context(context(), look_back_s=30.0, active={"r1"}, demand=demand)
    assert s.now == NOW
    by_id = {r.replica_id: r for r in s.replicas}
    assert by_id["r1"].state is ReplicaState.ACTIVE
    assert (by_id["r1"].waiting, by_id["r1"].running, by_id["r1"].kv_usage) == (6, 8, 0.75)
    assert by_id["r2"].state is ReplicaState.STANDBY  # running, but not assigned traffic
    assert s.count(ReplicaState.STARTING) == 4 - 2  # Serve targets 4, runs 2
    # The 40-45 s old points are outside the window; the standby's samples do not count.
    assert s.ttft_samples_s == (1.5, 2.5)
    assert s.tpot_samples_s == (0.04,)
    # Standbys take no traffic; what the front doors refused for capacity is demand too.
    assert s.arrival_rate_rps == 3.5 + 1.25
    assert sa.snapshot_from_context(context(), look_back_s=30.0, active={"r1"}).arrival_rate_rps == 3.5
    # Requests held at the front doors count; Serve's handle queue (2.4 here: control-plane
    # calls such as status probes, since user traffic never uses handles) does not.
    assert s.pending_at_ingress == 2


def test_without_role_assignment_every_running_replica_is_active():
    s = sa.snapshot_from_context(context(), look_back_s=30.0)
    assert s.count(ReplicaState.ACTIVE) == 2 and s.count(ReplicaState.STANDBY) == 0
    assert sorted(s.ttft_samples_s) == [1.5, 2.5, 7.0]


def test_stats_helper_reports_numbers_only():
    stats = autoscaling_stats(waiting=3, running=5, kv_usage=0.5,
                                 ttft_samples_s=[0.1 * i for i in range(1, 21)],
                                 tpot_samples_s=[0.01, 0.03], arrival_rps=2.0, load_s=31.5)
    assert all(isinstance(v, float) for v in stats.values())
    assert stats[sa.STAT_TTFT_P95_S] == pytest.approx(1.9)  # 19th of 20 by nearest rank
    assert stats[sa.STAT_TPOT_P95_S] == pytest.approx(0.03)
    assert stats[sa.STAT_LOAD_S] == 31.5
    none = autoscaling_stats(waiting=0, running=0, kv_usage=0.0, ttft_samples_s=[],
                                tpot_samples_s=[], arrival_rps=0.0, load_s=0.0)
    assert sa.STAT_TTFT_P95_S not in none and sa.STAT_TPOT_P95_S not in none


def test_warm_start_up_is_what_the_replicas_measured():
    cfg = AutoscaleConfig(startup_hot_s=5.0, startup_warm_s=45.0, startup_cold_s=180.0)
    ctx = context()
    assert sa.with_measured_startup(cfg, ctx) == cfg  # nothing reported: the config stands
    r1, r2 = ctx.running_replicas
    ctx.raw_metrics[sa.STAT_LOAD_S] = {r1: series((NOW - 5, 28.0)), r2: series((NOW - 5, 34.0))}
    measured = sa.with_measured_startup(cfg, ctx)
    assert measured.startup_warm_s == 31.0  # median of 28 and 34
    assert (measured.startup_hot_s, measured.startup_cold_s) == (5.0, 180.0)
    _, state = sa.decide_from_context(ctx, cfg)
    assert sa.decision_in(state).startup_s == {Tier.HOT: 5.0, Tier.WARM: 31.0, Tier.COLD: 180.0}
    # A load faster than a promotion, or slower than a cold start, is kept inside those bounds.
    ctx.raw_metrics[sa.STAT_LOAD_S] = {r1: series((NOW - 5, 0.2))}
    assert sa.with_measured_startup(cfg, ctx).startup_warm_s == 5.0
    ctx.raw_metrics[sa.STAT_LOAD_S] = {r1: series((NOW - 5, 900.0))}
    assert sa.with_measured_startup(cfg, ctx).startup_warm_s == 180.0


def test_a_sleeping_pool_takes_its_hot_start_up_from_the_wakes_the_replicas_measured():
    cfg = AutoscaleConfig(startup_hot_s=3.0, startup_warm_s=45.0, startup_cold_s=180.0)
    ctx = context()
    r1, r2 = ctx.running_replicas
    ctx.raw_metrics[sa.STAT_WAKE_S] = {r1: series((NOW - 5, 1.5)), r2: series((NOW - 5, 2.5))}
    # Not a sleeping pool (no promotion given): a wake reported anyway changes nothing.
    assert sa.with_measured_startup(cfg, ctx) == cfg
    measured = sa.with_measured_startup(cfg, ctx, promote_s=0.4)
    assert measured.startup_hot_s == pytest.approx(2.0 + 0.4)  # median wake, then the promotion
    assert (measured.startup_warm_s, measured.startup_cold_s) == (45.0, 180.0)
    _, state = sa.decide_from_context(ctx, cfg, promote_s=0.4)
    assert sa.decision_in(state).startup_s[Tier.HOT] == pytest.approx(2.4)
    # A load measured faster than the wake: the tiers stay ordered (warm kept at hot, hot <= warm).
    ctx.raw_metrics[sa.STAT_LOAD_S] = {r1: series((NOW - 5, 1.0))}
    slow = sa.with_measured_startup(cfg, ctx, promote_s=0.4)
    assert slow.startup_hot_s == slow.startup_warm_s == pytest.approx(2.4)
    stats = autoscaling_stats(waiting=0, running=0, kv_usage=0.0, ttft_samples_s=[], tpot_samples_s=[],
                                 arrival_rps=0.0, load_s=1.0, wake_s=1.75)
    assert stats[sa.STAT_WAKE_S] == 1.75
    assert sa.STAT_WAKE_S not in autoscaling_stats(waiting=0, running=0, kv_usage=0.0, ttft_samples_s=[],
                                                      tpot_samples_s=[], arrival_rps=0.0, load_s=1.0)


def test_roles_travel_in_policy_state_and_the_decision_record():
    # Scale-up wanted with a standby available: the standby is promoted in the same decision.
    cfg = AutoscaleConfig(upscale_delay_s=0.0, hot_standby_max=0)
    prior = {sa.ROLES_KEY: {"order": ["r1", "r2"], "active": ["r1"]}}
    _, state = sa.decide_from_context(context(policy_state=prior, target=2), cfg)
    record = sa.decision_in(state)
    assert record.target_active >= 2
    assert record.active_replicas == ("r1", "r2") and record.standby_replicas == ()
    assert "promote 1 standby" in record.reason
    assert state[sa.ROLES_KEY] == {"order": ["r1", "r2"], "active": ["r1", "r2"]}


def test_the_least_loaded_active_is_demoted_even_when_it_is_the_oldest():
    # r2 is older (first in the order) and idle; r1 holds 14 requests. One active must go
    # (max_replicas 1): the shared victim rule demotes r2, where newest-first demoted r1.
    cfg = AutoscaleConfig(max_replicas=1, hot_standby_max=0)
    prior = {sa.ROLES_KEY: {"order": ["r2", "r1"], "active": ["r2", "r1"]}}
    _, state = sa.decide_from_context(context(policy_state=prior, target=2), cfg)
    record = state[sa.DECISION_KEY]
    assert record["target_active"] == 1 and "demote 1 to standby" in record["reason"]
    assert record["active_replicas"] == ["r1"] and record["standby_replicas"] == ["r2"]


def test_decide_from_context_matches_decide_on_the_snapshot():
    cfg = AutoscaleConfig(upscale_delay_s=0.0)
    ctx = context()
    target, state = sa.decide_from_context(ctx, cfg)
    expected, _ = decide(sa.snapshot_from_context(ctx, cfg.look_back_s), cfg, PolicyState())
    assert target == expected.target_active + expected.target_standby[Tier.HOT]
    record = sa.decision_in(state)
    assert record.reason.startswith(expected.reason)
    assert record.serve_target == target and record.target_standby == expected.target_standby
    json.dumps(state)  # Serve keeps it between calls; it must stay plain data


def test_policy_state_carries_the_hysteresis_between_calls():
    cfg = AutoscaleConfig(rate_upscale_delay_s=30.0)
    # 3.5 rps on 1 active + 2 starting replicas: only the rate forecast asks for more, so
    # the wish must persist 30 s, and only policy_state remembers when it began.
    # r2 is a standby (roles from an earlier decision).
    roles_only = {sa.ROLES_KEY: {"order": ["r1", "r2"], "active": ["r1"]}}
    _, state = sa.decide_from_context(context(policy_state=roles_only), cfg)
    assert sa.decision_in(state).target_active == 3
    _, later = sa.decide_from_context(context(policy_state=state, now=NOW + 30), cfg)
    assert sa.decision_in(later).target_active == math.ceil(3.5 / 0.8)
    _, amnesiac = sa.decide_from_context(context(policy_state=roles_only, now=NOW + 30), cfg)
    assert sa.decision_in(amnesiac).target_active == 3


def test_runs_inside_serves_own_policy_wrapper():
    cfg = AutoscaleConfig(min_replicas=1, max_replicas=16, upscale_delay_s=0.0)
    serve_cfg = ray_config.AutoscalingConfig(**serve_autoscaling_config(cfg))
    assert serve_cfg.upscale_delay_s == 0 and serve_cfg.downscale_delay_s == 0
    policy = ray_state._resolve_policy_callable(serve_cfg.policy)  # what the controller does
    assert isinstance(policy, sa.HbmServeAutoscalingPolicy) and policy.config == cfg
    wrapped = ray_policy._apply_autoscaling_config(policy)
    ctx = context(config=serve_cfg)
    target, state = wrapped(ctx)
    ours, _ = sa.decide_from_context(context(config=serve_cfg), cfg)
    assert target == ours  # Serve's wrapper adds no delay and no factor on top
    assert sa.decision_in(state).serve_target == ours


def test_a_policy_state_from_another_version_is_read_with_a_clear_error_or_not_at_all():
    assert sa.decision_in({}) is None and sa.decision_in(None) is None
    with pytest.raises(RecordError, match="from Serve policy_state: .*field 'target_active': Input should be a valid integer"):
        sa.decision_in({sa.DECISION_KEY: {"target_active": "many"}})
    # The policy itself only logs from the previous record: a malformed one does not stop it.
    policy = sa.HbmServeAutoscalingPolicy(upscale_delay_s=0.0)
    target, state = policy(context(policy_state={sa.DECISION_KEY: {"target_active": "many"}}))
    assert sa.decision_in(state).serve_target == target


def test_the_warm_pool_is_kept_only_while_the_warm_tier_can_make_it_nodes():
    from hbmserve.core.records import WarmTierRecord

    cfg = AutoscaleConfig(warm_pool_min=1, warm_pool_max=1)
    _, alone = sa.decide_from_context(context(), cfg)
    record = sa.decision_in(alone)
    assert record.target_standby[Tier.WARM] == 0 and "warm 1->0: no warm-tier aggregator" in record.reason
    tier = WarmTierRecord(at=NOW - 1, node_autoscaler=True, warmable=("engine",), bundles=(), reason="")
    target, served = sa.decide_from_context(context(), cfg, warm_tier=tier)
    record = sa.decision_in(served)
    assert record.target_standby[Tier.WARM] == 1 and "warm 1->0" not in record.reason
    assert target == record.serve_target  # warm nodes are no Serve replicas
    no_nodes = WarmTierRecord(**{**tier.__dict__, "node_autoscaler": False})
    assert "no node autoscaler" in sa.decision_in(sa.decide_from_context(context(), cfg, warm_tier=no_nodes)[1]).reason


def test_the_decision_record_carries_the_prior_and_what_it_holds():
    from hbmserve.autoscale.memory.prior import prior_hold

    plain = sa.decision_in(sa.decide_from_context(context(), AutoscaleConfig())[1])
    assert (plain.prior_source, plain.prior_hold, plain.not_in_time) == ("", 0, 0)
    learnt = AutoscaleConfig(replica_capacity_rps=2.0, prior_rises_rps=(0.2, 9.0, 9.0, 9.0),
                             prior_source="past.csv (4 buckets of 180 s)")
    record = sa.decision_in(sa.decide_from_context(context(), learnt)[1])
    assert record.prior_source == "past.csv (4 buckets of 180 s)"
    assert record.prior_hold == prior_hold(learnt) >= 5  # bursts of 9 rps on 2 rps replicas


def test_a_hold_not_in_time_joins_the_decision_log_once(monkeypatch):
    published: list[bool] = []
    monkeypatch.setattr(sa.DecisionLog, "publish", lambda self, app, dep, decision, changed=True: published.append(changed))
    _, state = sa.decide_from_context(context(), AutoscaleConfig())
    record = sa.decision_in(state)
    held = dataclasses.replace(record, not_in_time=2, reason=f"hold 2 (not in time: ...); {record.reason}")
    again = dataclasses.replace(held, at=record.at + 1)
    log = sa.DecisionLog()
    changes = [sa.publish_decision(log, "app", "engine", d, {sa.DECISION_KEY: p.to_dict()})
               for p, d in ((record, held), (held, again), (again, record))]
    # The first hold is a new plan (logged); the same hold a tick later is not; its end is.
    assert changes == [True, False, True] == published
