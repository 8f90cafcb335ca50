"""The cluster simulator with a scaling policy: start-up tiers, draining, billing, scale from zero."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from hbmserve.autoscale import roles
from hbmserve.core.scaling import ReplicaState, ScaleDecision, Snapshot, Tier
from hbmserve.capacity.sim import cluster_sim
from hbmserve.capacity.traces.arrivals import Arrivals, gamma_arrivals
from hbmserve.capacity.sim.cluster_sim import PolicyBinding, SimCluster, simulate
from hbmserve.core.config import SloSeconds
from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment

DEP = Deployment(load_model_shape("llama-3.1-8b"), get_gpu("h100-sxm"), tp=2)
ENG = EngineConfig(num_blocks=20_000, max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=4096)
STARTUP = {Tier.HOT: 5.0, Tier.WARM: 60.0, Tier.COLD: 600.0}
LOAD = gamma_arrivals(2.0, 120.0, 1.0, prompt_tokens=300, output_tokens=50, seed=4)


def cluster(replicas: int) -> SimCluster:
    return SimCluster(DEP, ENG, replicas, SloSeconds(2.0, 0.1))


def scripted(snapshot: Snapshot, state, *, steps, standby=None):
    """Target `n` from time `t` on, for each (t, n) in steps; records what it saw."""
    seen = (state or ()) + (snapshot,)
    due = [n for t, n in steps if t <= snapshot.now]
    target = due[-1] if due else 1
    return ScaleDecision(target, dict(standby or {}), f"scripted {target}"), seen


def test_fixed_replicas_bill_replicas_times_gpus_times_makespan():
    res = simulate(cluster(3), LOAD)
    s = res.summary
    assert s.finished == len(LOAD) and s.peak_replicas == 3
    assert s.gpu_hours == pytest.approx(3 * 2 * s.makespan_s / 3600)
    assert s.cost_usd == pytest.approx(s.gpu_hours * 3.0)
    assert s.usd_per_mtok == pytest.approx(s.cost_usd / (s.output_tokens / 1e6))
    assert all(r.tokens_processed > 0 for r in res.replicas)  # the router spread the load


def test_hot_standby_is_promoted_first_and_becomes_active_after_its_delay():
    pol = functools.partial(scripted, steps=[(0.0, 1), (20.0, 2)])
    res = simulate(cluster(1), LOAD, PolicyBinding(pol, None, 10.0, 30.0, STARTUP, {Tier.HOT: 1}))
    ts = res.timeseries
    t, active = ts["t_s"], ts["active"]
    assert active[(t >= 10) & (t < 20)].max() == 1
    assert active[(t >= 25) & (t < 100)].min() == 2  # promoted at 20, active after the 5 s HOT delay
    assert active[(t > 20) & (t < 25)].max() == 1
    assert res.summary.peak_replicas == 2  # no cold replica was added
    assert (20.0, 2, "scripted 2") in res.decisions


def test_without_standby_a_cold_replica_takes_the_cold_delay():
    pol = functools.partial(scripted, steps=[(0.0, 1), (20.0, 2)])
    long_load = gamma_arrivals(1.0, 800.0, 1.0, prompt_tokens=200, output_tokens=20, seed=5)
    res = simulate(cluster(1), long_load, PolicyBinding(pol, None, 10.0, 30.0, STARTUP))
    t, active, starting = res.timeseries["t_s"], res.timeseries["active"], res.timeseries["starting"]
    assert active[(t > 20) & (t < 619)].max() == 1 and starting[(t > 21) & (t < 619)].min() == 1
    assert active[(t > 621) & (t < 700)].min() == 2


def test_scale_down_drains_in_flight_requests_then_removes_the_replica():
    pol = functools.partial(scripted, steps=[(0.0, 2), (30.0, 1)])
    res = simulate(cluster(2), LOAD, PolicyBinding(pol, None, 10.0, 30.0, STARTUP))
    s = res.summary
    assert s.finished == len(LOAD) and s.unfinished == 0
    lifetimes = sorted(r.lifetime_s for r in res.replicas)
    assert 30.0 <= lifetimes[0] < 60.0  # drained shortly after 30 s, not kept to the end
    assert lifetimes[1] == pytest.approx(s.makespan_s)
    assert s.gpu_hours == pytest.approx(sum(lifetimes) * 2 / 3600)


def test_standby_replicas_are_billed():
    pol = functools.partial(scripted, steps=[(0.0, 1)], standby={Tier.WARM: 2})
    res = simulate(cluster(1), LOAD, PolicyBinding(pol, None, 10.0, 30.0, STARTUP))
    s = res.summary
    assert s.peak_replicas == 3
    assert s.gpu_hours == pytest.approx(3 * 2 * s.makespan_s / 3600)
    assert res.timeseries["standby"][-1] == 2


def test_scale_from_zero_holds_requests_at_the_ingress():
    def wake_on_pending(snapshot: Snapshot, state):
        up = state or snapshot.pending_at_ingress > 0
        return ScaleDecision(1 if up else 0, {}, "wake" if up else "idle"), up

    arr = Arrivals(np.array([1.0, 2.0]), np.array([100, 100]), np.array([10, 10]))
    res = simulate(cluster(0), arr, PolicyBinding(wake_on_pending, False, 10.0, 30.0, STARTUP))
    s = res.summary
    assert s.finished == 2
    # Seen at the 10 s tick, then a cold start: the first token comes after 610 s.
    assert s.ttft.p50 >= 600.0
    assert res.timeseries["pending"].max() == 2


def test_the_policy_sees_snapshots_of_the_simulated_replicas():
    pol = functools.partial(scripted, steps=[(0.0, 2)])
    run = {}

    def spy(snapshot, state):
        d, seen = pol(snapshot, state)
        run["seen"] = seen
        return d, seen

    simulate(cluster(2), LOAD, PolicyBinding(spy, None, 10.0, 30.0, STARTUP))
    snaps = run["seen"]
    assert [s.now for s in snaps[:3]] == [0.0, 10.0, 20.0]
    mid = snaps[6]
    assert mid.count(ReplicaState.ACTIVE) == 2
    assert 1.0 < mid.arrival_rate_rps < 3.5
    assert mid.ttft_samples_s and all(x > 0 for x in mid.ttft_samples_s)


def test_snapshots_show_hot_standby_as_replicas_and_warm_standby_as_warm_ready():
    seen = []

    def pol(snapshot: Snapshot, state):
        seen.append(snapshot)
        return ScaleDecision(1, {Tier.HOT: 1, Tier.WARM: 2}, "pool"), state

    simulate(cluster(1), LOAD, PolicyBinding(pol, None, 10.0, 30.0, STARTUP, {Tier.HOT: 1, Tier.WARM: 2}))
    first = seen[0]
    assert first.count(ReplicaState.STANDBY) == 1 and first.count(ReplicaState.ACTIVE) == 1
    assert first.warm_ready == 2


def test_scale_down_drains_by_the_same_rule_the_live_roles_demote_by(monkeypatch):
    rule, calls = roles.scale_down_victims, []

    def spy(candidates, n):
        candidates = list(candidates)
        picked = rule(candidates, n)
        calls.append((candidates, n, picked))
        return picked

    assert cluster_sim.scale_down_victims is rule  # one function, imported by the simulator
    monkeypatch.setattr(cluster_sim, "scale_down_victims", spy)
    monkeypatch.setattr(roles, "scale_down_victims", spy)
    pol = functools.partial(scripted, steps=[(0.0, 3), (30.0, 1)])
    simulate(cluster(3), LOAD, PolicyBinding(pol, None, 10.0, 30.0, STARTUP))
    assert len(calls) == 1
    sim_candidates, n, sim_picked = calls[0]
    assert n == 2 and all(c.serving for c in sim_candidates)
    least = sorted(c.in_flight for c in sim_candidates)[:2]
    assert sorted(c.in_flight for c in sim_candidates if c.replica_id in sim_picked) == least
    # The live role assignment, shown the same replicas and loads, demotes the same two.
    order = tuple(c.replica_id for c in sorted(sim_candidates, key=lambda c: c.started))
    live = roles.assign_roles(set(order), order, set(order), target_active=1,
                              in_flight={c.replica_id: c.in_flight for c in sim_candidates})
    assert len(calls) == 2 and set(live.demoted) == set(sim_picked)


def test_a_scale_down_demotes_into_the_hot_pool_instead_of_building_a_new_standby():
    """As live, where Serve keeps active + hot running and the roles demote the surplus: the
    replicas scaled down become the hot standbys, finish what they held, and are promoted
    again after the hot delay. No replica is started for the pool."""
    def pol(snapshot: Snapshot, state):
        down = 30.0 <= snapshot.now < 60.0
        return ScaleDecision(1 if down else 3, {Tier.HOT: 2 if down else 0}, "scripted"), state

    res = simulate(cluster(3), LOAD, PolicyBinding(pol, None, 10.0, 30.0, STARTUP))
    s, ts = res.summary, res.timeseries
    t, active, standby, draining = ts["t_s"], ts["active"], ts["standby"], ts["draining"]
    assert s.finished == len(LOAD) and s.unfinished == 0  # the demoted ones finished their work
    assert len(res.replicas) == 3 and s.peak_replicas == 3  # the pool was filled by demotion
    assert standby[(t > 30) & (t < 60)].min() == 2 and active[(t > 30) & (t < 60)].max() == 1
    assert draining.max() == 0
    assert active[(t > 66) & (t < 100)].min() == 3  # promoted back after the 5 s hot delay


def test_starts_removed_before_serving_are_counted_as_cancelled():
    # 1 -> 3 at 10 s (two cold starts, 600 s), back to 1 at 30 s: both cancelled unserved.
    # A hot standby ordered at 0 (prepared for 600 - 5 s) and dropped from the pool at 40 s
    # never served either. The replica serving from t=0 is not a start.
    def policy(snapshot, state):
        target = 3 if 10.0 <= snapshot.now < 30.0 else 1
        pool = {Tier.HOT: 1 if snapshot.now < 40.0 else 0}
        return ScaleDecision(target, pool, "blip"), state

    res = simulate(cluster(1), LOAD, PolicyBinding(policy, None, 10.0, 30.0, STARTUP))
    assert res.cancelled_starts == 3
    # Without the blip and the pool: nothing started, nothing cancelled.
    res = simulate(cluster(1), LOAD, PolicyBinding(lambda s, st: (ScaleDecision(1), st), None,
                                                   10.0, 30.0, STARTUP))
    assert res.cancelled_starts == 0


def test_a_start_that_served_is_not_cancelled_when_it_is_removed():
    # A cold start ordered at 0 serves from 20 s and is removed at 60 s: it served.
    fast = {Tier.HOT: 5.0, Tier.WARM: 10.0, Tier.COLD: 20.0}
    pol = functools.partial(scripted, steps=[(0.0, 2), (60.0, 1)])
    res = simulate(cluster(1), LOAD, PolicyBinding(pol, None, 10.0, 30.0, fast))
    assert res.cancelled_starts == 0 and res.summary.peak_replicas == 2
    # Removed at 10 s instead, before its start-up ended: cancelled.
    pol = functools.partial(scripted, steps=[(0.0, 2), (10.0, 1)])
    res = simulate(cluster(1), LOAD, PolicyBinding(pol, None, 10.0, 30.0, fast))
    assert res.cancelled_starts == 1


def test_a_busy_replica_demoted_then_promoted_back_serves_and_finishes_its_work():
    # Two actives under load; at 30 s one is demoted into the hot pool with requests in
    # flight (its step still running), at 31 s promoted back (5 s). Its step must complete and
    # its start-up must end: every request finishes, and 2 actives serve again from ~36 s.
    def policy(snapshot, state):
        target = 1 if 30.0 <= snapshot.now < 31.0 else 2
        return ScaleDecision(target, {Tier.HOT: 1 if snapshot.now >= 30.0 else 0}, "blip"), state

    load = gamma_arrivals(6.0, 120.0, 1.0, prompt_tokens=300, output_tokens=400, seed=2)
    res = simulate(cluster(2), load, PolicyBinding(policy, None, 1.0, 30.0, STARTUP))
    assert res.summary.finished == len(load) and res.summary.unfinished == 0
    ts = res.timeseries
    assert ts["active"][(ts["t_s"] >= 40) & (ts["t_s"] <= 100)].min() == 2
    assert res.summary.makespan_s < 200.0
