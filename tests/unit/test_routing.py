"""The pure request router: least loaded among ACTIVE replicas, with bounded prefix affinity."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hbmserve.core.scaling import ReplicaState
from hbmserve.core.routing import ReplicaLoad, RouteRequest
from hbmserve.routing.choose import choose

REQ = RouteRequest(prompt_tokens=100, max_tokens=50)


def load(rid, waiting=0, running=0, kv=0.0, state=ReplicaState.ACTIVE, prefixes=frozenset()):
    return ReplicaLoad(rid, state, waiting, running, kv, prefixes)


def test_least_loaded_by_waiting_then_running_then_kv():
    d = choose([load("a", 2, 0), load("b", 1, 9), load("c", 1, 3, 0.9), load("d", 1, 3, 0.1)], REQ)
    assert d.ranked == ("d", "c", "b", "a")
    assert "least loaded: d" in d.reason


def test_only_active_replicas_are_eligible():
    d = choose([load("s", state=ReplicaState.STARTING), load("w", state=ReplicaState.STANDBY),
                load("x", state=ReplicaState.DRAINING), load("a", 50, 50, 1.0)], REQ)
    assert d.ranked == ("a",)


def test_no_active_replica_gives_empty_ranking_with_reason():
    d = choose([load("s", state=ReplicaState.STARTING)], REQ)
    assert d.ranked == () and "no active replica" in d.reason


def test_prefix_affinity_wins_within_slack_and_yields_beyond_it():
    req = RouteRequest(100, 50, prefix_hash=7)
    near = choose([load("a", 0), load("b", 3, prefixes={7})], req, affinity_slack=4)
    assert near.ranked[0] == "b" and "prefix affinity" in near.reason
    far = choose([load("a", 0), load("b", 5, prefixes={7})], req, affinity_slack=4)
    assert far.ranked[0] == "a" and "queue too long" in far.reason
    no_hash = choose([load("a", 0), load("b", 3, prefixes={7})], REQ)
    assert no_hash.ranked[0] == "a"


loads = st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20), st.floats(0, 1),
                           st.sampled_from(list(ReplicaState))), min_size=0, max_size=12)


@given(loads)
def test_ranking_is_a_sorted_permutation_of_the_active_replicas(rows):
    reps = [load(f"r{i}", w, r, kv, s) for i, (w, r, kv, s) in enumerate(rows)]
    d = choose(reps, REQ)
    active = [r for r in reps if r.state is ReplicaState.ACTIVE]
    assert sorted(d.ranked) == sorted(r.replica_id for r in active)
    by_id = {r.replica_id: r for r in reps}
    keys = [(by_id[i].waiting, by_id[i].running, by_id[i].kv_usage) for i in d.ranked]
    assert keys == sorted(keys)
