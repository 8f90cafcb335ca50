"""Role assignment and the scale-down victim rule (autoscale/roles.py)."""

from __future__ import annotations

from itertools import combinations

from hypothesis import given
from hypothesis import strategies as st

from hbmserve.autoscale.roles import (VictimCandidate, age_order, assign_roles, current_active,
                                      scale_down_victims)


def test_first_assignment_keeps_everything_running_active_up_to_the_target():
    a = assign_roles({"b", "a", "c"}, (), None, target_active=2)
    assert a.order == ("a", "b", "c")  # new replicas, no history: a stable order
    assert a.active == ("a", "b") and a.standby == ("c",)
    assert a.demoted == ("c",) and a.promoted == ()


def test_standbys_are_promoted_oldest_first():
    a = assign_roles({"r1", "r2", "r3", "r4"}, ("r1", "r3", "r2", "r4"), {"r1"}, target_active=3)
    assert a.promoted == ("r3", "r2")  # r3 was seen before r2
    assert a.active == ("r1", "r3", "r2") and a.standby == ("r4",)
    assert a.describe() == "promote 2 standby"


def test_surplus_actives_are_demoted_newest_first():
    # Serve stops the newest replicas first; they must be the ones out of rotation.
    a = assign_roles({"r1", "r2", "r3"}, ("r1", "r2", "r3"), {"r1", "r2", "r3"}, target_active=1)
    assert a.active == ("r1",) and a.demoted == ("r2", "r3")


def test_an_active_replica_that_vanished_is_replaced_by_a_standby():
    a = assign_roles({"r2", "r3"}, ("r1", "r2", "r3"), {"r1", "r2"}, target_active=2)
    assert a.active == ("r2", "r3") and a.promoted == ("r3",)


def test_zero_target_leaves_no_active_replica():
    a = assign_roles({"r1"}, ("r1",), {"r1"}, target_active=0)
    assert a.active == () and a.demoted == ("r1",)


def test_age_order_appends_new_replicas_after_known_ones():
    assert age_order({"z", "a", "m"}, ("m", "gone")) == ("m", "a", "z")
    assert current_active(("m", "a"), None) == ("m", "a")
    assert current_active(("m", "a"), {"a", "gone"}) == ("a",)


ids = st.lists(st.sampled_from([f"r{i}" for i in range(8)]), unique=True, max_size=8)


@given(running=ids, previous=ids, prev_active=st.none() | ids, target=st.integers(0, 10))
def test_assignment_invariants(running, previous, prev_active, target):
    a = assign_roles(set(running), previous, None if prev_active is None else set(prev_active), target)
    assert set(a.order) == set(running) and len(a.order) == len(running)
    assert set(a.active) <= set(running)
    assert len(a.active) == min(target, len(running))  # exactly the target, if enough run
    still = set(current_active(a.order, None if prev_active is None else set(prev_active)))
    # Nobody serving is moved away while the target still has room for them.
    kept = still & set(a.active)
    assert len(kept) == min(len(still), target)
    assert not (set(a.promoted) & still) and set(a.demoted) <= still


def test_victims_are_the_least_loaded_with_ties_newest_first():
    c = [VictimCandidate("old-busy", 7, 0), VictimCandidate("old-idle", 0, 1),
         VictimCandidate("mid", 2, 2), VictimCandidate("new-idle", 0, 3)]
    assert scale_down_victims(c, 1) == ("new-idle",)  # 0 in flight, and newer than old-idle
    assert scale_down_victims(c, 3) == ("new-idle", "old-idle", "mid")
    assert scale_down_victims(c, 0) == () and scale_down_victims(c, -1) == ()
    assert len(scale_down_victims(c, 9)) == 4


def test_replicas_not_yet_serving_go_before_any_serving_one():
    c = [VictimCandidate("idle", 0, 9), VictimCandidate("starting", 0, 1, serving=False)]
    assert scale_down_victims(c, 1) == ("starting",)


candidates = st.lists(st.tuples(st.integers(0, 12), st.booleans()), max_size=8).map(
    lambda xs: [VictimCandidate(f"r{i}", load, float(i), serving) for i, (load, serving)
                in enumerate(xs)])


@given(cands=candidates, n=st.integers(0, 9))
def test_victims_lose_the_least_work_of_any_choice(cands, n):
    picked = scale_down_victims(cands, n)
    by_id = {c.replica_id: c for c in cands}
    assert len(picked) == len(set(picked)) == min(n, len(cands))
    # Every replica not yet serving goes before any serving one ...
    not_serving = {c.replica_id for c in cands if not c.serving}
    assert set(picked) <= not_serving or not_serving <= set(picked)
    # ... and the serving ones picked hold the least in-flight work of any choice of as many.
    serving = [c for c in cands if c.serving]
    k = sum(1 for r in picked if by_id[r].serving)
    best = min(sum(c.in_flight for c in combo) for combo in combinations(serving, k))
    assert sum(by_id[r].in_flight for r in picked if by_id[r].serving) == best
    # Among equally loaded serving replicas, none kept is newer than one picked.
    for v in (by_id[r] for r in picked if by_id[r].serving):
        kept = [c for c in serving if c.replica_id not in picked and c.in_flight == v.in_flight]
        assert all(c.started < v.started for c in kept)


def test_surplus_actives_are_demoted_least_loaded_first():
    # r1 is the oldest but idle; r2 is busiest. Before the shared rule, r1 stayed (oldest).
    a = assign_roles({"r1", "r2", "r3"}, ("r1", "r2", "r3"), {"r1", "r2", "r3"}, target_active=1,
                     in_flight={"r1": 0, "r2": 5, "r3": 3})
    assert a.active == ("r2",) and a.demoted == ("r1", "r3")
    assert a.describe() == "demote 2 to standby"


def test_roles_state_round_trips_and_reads_what_older_versions_left():
    from hbmserve.autoscale.roles import RolesState

    state = RolesState(order=("a", "b", "c"), active=("b",))
    assert RolesState.from_dict(state.to_dict()) == state
    assert RolesState.from_dict(None) == RolesState() and RolesState().active is None  # none assigned: all active
    assert RolesState.from_dict({"order": ["a"]}) == RolesState(order=("a",), active=None)
    assert RolesState.from_dict({"order": ["a"], "active": []}).active == ()  # every replica stood down
