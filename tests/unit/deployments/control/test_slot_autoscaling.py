"""Autoscaling a placed model: one Serve deployment per planned slot, one decision for all.

The pure parts (autoscale/slots.py: which slots run for a target) by property; the adapter
(deployments/control/slot_autoscaling.py) fed real Serve AutoscalingContexts, its Ray KV calls replaced
by a dict, so no cluster starts. The central check: a model split over slot deployments decides
exactly what the same replicas decide as one deployment.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.slots import leaving, slot_min_replicas, slot_targets
from hbmserve.core.records import SlotStats
from hbmserve.deployments.control import autoscaling as sa
from hbmserve.deployments.control import slot_autoscaling as slots_mod
from hbmserve.deployments.apps.autoscaling_options import slot_autoscaling_configs
ray_config = pytest.importorskip("ray.serve.config", reason="ray[serve] not installed")
ray_common = pytest.importorskip("ray.serve._private.common", reason="ray[serve] not installed")

NOW = 1_000.0
MODEL_DEP = "engine-m"


@given(st.integers(-3, 12), st.integers(0, 8))
def test_slots_fill_lowest_first_and_hold_the_target(target, slots):
    t = slot_targets(target, slots)
    assert len(t) == slots and set(t) <= {0, 1}
    assert sum(t) == min(max(target, 0), slots)
    assert list(t) == sorted(t, reverse=True)  # every running slot below every idle one


@given(st.integers(0, 8), st.integers(0, 8), st.integers(1, 8))
def test_scale_down_stops_the_highest_slots_and_scale_up_starts_the_lowest_idle(before, after, slots):
    old, new = slot_targets(before, slots), slot_targets(after, slots)
    stopped = [k for k in range(slots) if old[k] and not new[k]]
    started = [k for k in range(slots) if new[k] and not old[k]]
    assert stopped == list(range(min(after, slots), min(before, slots)))
    assert started == list(range(min(before, slots), min(after, slots)))
    # The replicas `leaving` names are exactly those in the stopped slots.
    running = {f"r{k}": k for k in range(slots) if old[k]}
    assert leaving(running, after) == {f"r{k}" for k in stopped}


def test_the_model_floor_is_kept_by_the_lowest_slots():
    assert [slot_min_replicas(2, k) for k in range(4)] == [1, 1, 0, 0]
    assert [slot_min_replicas(0, k) for k in range(2)] == [0, 0]


# -- the adapter, on real AutoscalingContexts ----------------------------------------------------

def rid(name: str, deployment: str):
    return ray_common.ReplicaID(unique_id=name, deployment_id=ray_common.DeploymentID(name=deployment, app_name="m"))


def series(*points):
    return [ray_common.TimeStampedValue(t, v) for t, v in points]


# Per replica: (waiting, running, arrival rps, TTFT p95 points).
LOAD = {"a": (6.0, 8.0, 3.0, ((NOW - 45, 9.0), (NOW - 3, 1.5))),
        "b": (1.0, 2.0, 1.5, ((NOW - 2, 0.7),))}


def context(deployment: str, names: list[str], *, target: int, policy_state=None, load=LOAD):
    ids = [rid(n, deployment) for n in names]
    raw = {
        sa.STAT_WAITING: {i: series((NOW - 1, load[n][0])) for i, n in zip(ids, names)},
        sa.STAT_RUNNING: {i: series((NOW - 1, load[n][1])) for i, n in zip(ids, names)},
        sa.STAT_ARRIVAL_RPS: {i: series((NOW - 1, load[n][2])) for i, n in zip(ids, names)},
        sa.STAT_TTFT_P95_S: {i: series(*load[n][3]) for i, n in zip(ids, names)},
    }
    # Serve's own aggregate only, for one stat: the adapter carries it as a point.
    aggregated = {sa.STAT_KV_USAGE: {i: 0.5 for i in ids}}
    return ray_config.AutoscalingContext(
        deployment_id=ray_common.DeploymentID(name=deployment, app_name="m"), deployment_name=deployment,
        app_name="m", current_num_replicas=len(ids), target_num_replicas=target, running_replicas=ids,
        total_num_requests=0.0, total_queued_requests=0.0, aggregated_metrics=aggregated,
        raw_metrics=lambda: raw, capacity_adjusted_min_replicas=0, capacity_adjusted_max_replicas=1,
        policy_state=policy_state or {}, last_scale_up_time=None, last_scale_down_time=None,
        current_time=NOW, config=None)


CONFIG = AutoscaleConfig(min_replicas=1, max_replicas=4, replica_capacity_rps=1.0, upscale_delay_s=0.0)


def test_a_model_over_slot_deployments_decides_what_one_deployment_decides():
    merged, slot_of = slots_mod.model_context(
        [slots_mod.stats_of(context("engine-m-r0", ["a"], target=1), 0, CONFIG.look_back_s),
         slots_mod.stats_of(context("engine-m-r1", ["b"], target=1), 1, CONFIG.look_back_s),
         slots_mod.stats_of(context("engine-m-r2", [], target=1), 2, CONFIG.look_back_s)],  # starting
        NOW, {}, "m", MODEL_DEP)
    assert slot_of == {"a": 0, "b": 1}
    assert (merged.target_num_replicas, merged.current_num_replicas) == (3, 2)
    one = context(MODEL_DEP, ["a", "b"], target=3)
    want_target, want_state = sa.decide_from_context(one, CONFIG)
    got_target, got_state = sa.decide_from_context(merged, CONFIG, slot_of=slot_of)
    assert got_target == want_target == 4  # 4.5 rps at 1 rps per replica, capped at max 4
    want, got = sa.decision_in(want_state), sa.decision_in(got_state)
    assert got.to_dict() == want.to_dict()
    # The 45 s old TTFT point left the 30 s window on the way; the latest ones came through.
    assert merged.raw_metrics[sa.STAT_TTFT_P95_S]["a"][-1].value == 1.5
    assert [p.value for p in merged.raw_metrics[sa.STAT_KV_USAGE]["b"]] == [0.5]


def test_a_slot_reported_twice_counts_once():
    old = SlotStats(at=NOW - 1, slot=0, target=1, current=1, replicas={"old": {}})
    new = SlotStats(at=NOW, slot=0, target=1, current=1, replicas={"new": {}})
    merged, slot_of = slots_mod.model_context([new, old], NOW, {}, "m", MODEL_DEP)
    assert slot_of == {"new": 0} and merged.current_num_replicas == 1


def test_scaling_down_keeps_the_roles_on_the_replicas_that_stay():
    """Two actives in slots 0 and 1, load gone: the target drops to 1 and Serve stops slot 1, so
    slot 0's replica keeps the traffic although it is the least loaded (the least-loaded rule
    alone would demote it, and no active replica would be left once slot 1 stops)."""
    cfg = AutoscaleConfig(min_replicas=1, max_replicas=2, replica_capacity_rps=10.0, hot_standby_max=0,
                          downscale_delay_s=0.0, downscale_cooldown_s=0.0)
    state = {sa.ROLES_KEY: {"order": ["a", "b"], "active": ["a", "b"]}}
    quiet = {"a": (0.0, 1.0, 0.2, ()), "b": (0.0, 3.0, 0.5, ())}  # a, in slot 0, the least loaded
    merged, slot_of = slots_mod.model_context(
        [slots_mod.stats_of(context("engine-m-r0", ["a"], target=1, load=quiet), 0, cfg.look_back_s),
         slots_mod.stats_of(context("engine-m-r1", ["b"], target=1, load=quiet), 1, cfg.look_back_s)],
        NOW, state, "m", MODEL_DEP)
    target, policy_state = sa.decide_from_context(merged, cfg, slot_of=slot_of)
    decision = sa.decision_in(policy_state)
    assert target == 1 and slot_targets(target, 2) == (1, 0)
    assert decision.active_replicas == ("a",) and "b" not in decision.standby_replicas
    # Without slots (one deployment) the least-loaded active, a, is the one demoted.
    _, plain = sa.decide_from_context(context(MODEL_DEP, ["a", "b"], target=2, policy_state=state, load=quiet), cfg)
    assert sa.decision_in(plain).active_replicas == ("b",)


class FakeStore:
    """The KV the slot policies share, and what the leader published."""

    def __init__(self, monkeypatch):
        self.stats: dict[int, SlotStats] = {}
        self.decision = None
        monkeypatch.setattr(slots_mod, "publish_slot_stats", lambda app, dep, s: self.stats.__setitem__(s.slot, s))
        monkeypatch.setattr(slots_mod, "slot_stats", lambda app, dep, now: list(self.stats.values()))
        monkeypatch.setattr(slots_mod, "latest_decision", lambda app, dep: self.decision)
        monkeypatch.setattr(sa, "ingress_demand", lambda app, dep: None)
        monkeypatch.setattr(sa.DecisionLog, "publish", lambda _, app, dep, d, changed=False: setattr(self, "decision", d))
        monkeypatch.setattr(sa, "latest_warm_tier", lambda: None)


def test_the_leader_decides_for_every_slot_and_followers_follow(monkeypatch):
    store = FakeStore(monkeypatch)
    kwargs = {"slots": 3, "model_deployment": MODEL_DEP, "look_back_s": 30.0}
    leader = slots_mod.SlotAutoscalingPolicy(slot=0, leader=asdict(CONFIG) | {"max_replicas": 3}, **kwargs)
    followers = [slots_mod.SlotAutoscalingPolicy(slot=k, **kwargs) for k in (1, 2)]
    # Before any decision a follower keeps what Serve has.
    assert followers[0](context("engine-m-r1", [], target=0))[0] == 0
    followers[0](context("engine-m-r1", ["b"], target=1))
    target, state = leader(context("engine-m-r0", ["a"], target=1))
    assert (target, store.decision.serve_target) == (1, 3)  # 4.5 rps wants 5, capped at 3 slots
    assert set(store.decision.active_replicas) == {"a", "b"}
    assert [f(context(f"engine-m-r{k}", [], target=0))[0] for k, f in zip((1, 2), followers)] == [1, 1]
    assert sa.POLICY_STATE_KEY in state  # the hysteresis lives in slot 0's Serve policy state


def test_slot_deployments_carry_the_slot_policy_and_the_floor():
    from hbmserve.core.config import parse_cluster_spec

    model = parse_cluster_spec({"models": [{"name": "m", "source": "/m", "engine": "sim",
                                            "autoscaling": {"min_replicas": 1, "max_replicas": 3}}]}).models[0]
    configs = slot_autoscaling_configs(model, 3, MODEL_DEP)
    assert [(c["min_replicas"], c["max_replicas"]) for c in configs] == [(1, 1), (0, 1), (0, 1)]
    policies = [c["policy"] for c in configs]
    assert {p["policy_function"] for p in policies} == {slots_mod.SLOT_POLICY_PATH}
    assert [p["policy_kwargs"]["slot"] for p in policies] == [0, 1, 2]
    leader = policies[0]["policy_kwargs"]["leader"]
    assert leader["max_replicas"] == 3 and leader["min_replicas"] == 1
    assert [p["policy_kwargs"]["leader"] for p in policies[1:]] == [None, None]
    # Serve's own delays stay off: the policy's hysteresis is the only one (autoscaling.py).
    assert all(c["upscale_delay_s"] == c["downscale_delay_s"] == 0.0 for c in configs)
    # Each builds a real policy object, as Serve's controller would from the kwargs.
    built = slots_mod.SlotAutoscalingPolicy(**policies[0]["policy_kwargs"])
    assert built.leader is not None and built.leader.config.max_replicas == 3
