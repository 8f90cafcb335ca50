"""Role assignment: which running replicas serve and which stand by (autoscale/roles.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hbmserve.autoscale.roles import age_order, assign_roles, current_active


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
