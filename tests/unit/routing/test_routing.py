"""The pure request routers: `choose` (longest cached prefix within a load slack, power of two
otherwise) and the baselines it is measured against."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hbmserve.core.scaling import ReplicaState
from hbmserve.core.routing import ReplicaLoad, RouteRequest
from hbmserve.routing.routers import least_loaded, power_of_two, round_robin
from hbmserve.routing.choose import choose, load_key, matched_blocks, two_choices

REQ = RouteRequest(prompt_tokens=100, max_tokens=50)


def load(rid, waiting=0, running=0, kv=0.0, state=ReplicaState.ACTIVE, prefixes=frozenset()):
    return ReplicaLoad(rid, state, waiting, running, kv, prefixes)


def test_two_or_fewer_replicas_without_a_prefix_go_least_loaded_by_waiting_then_running_then_kv():
    assert choose([load("b", 1, 9), load("a", 2, 0)], REQ).ranked == ("b", "a")
    d = choose([load("c", 1, 3, 0.9), load("d", 1, 3, 0.1)], REQ)
    assert d.ranked == ("d", "c") and "least loaded" in d.reason


def test_more_than_two_without_a_prefix_take_the_less_loaded_of_two_drawn_from_the_salt():
    reps = [load("a", 2, 0), load("b", 1, 9), load("c", 1, 3, 0.9), load("d", 1, 3, 0.1)]
    order = ["d", "c", "b", "a"]  # by (waiting, running, kv)
    for salt in range(40):
        i, j = two_choices(4, salt)
        d = choose(reps, RouteRequest(100, 50, salt=salt))
        assert d.ranked[0] == order[min(i, j)] and "two choices" in d.reason
        assert list(d.ranked[1:]) == [r for r in order if r != d.ranked[0]]
    # Counters 0..n spread the picks (all but the most loaded get some); the same salt replays.
    firsts = {choose(reps, RouteRequest(100, 50, salt=s)).ranked[0] for s in range(40)}
    assert firsts == {"d", "c", "b"}
    assert choose(reps, RouteRequest(1, 1, salt=7)) == choose(reps, RouteRequest(1, 1, salt=7))


def test_only_active_replicas_are_eligible():
    d = choose([load("s", state=ReplicaState.STARTING), load("w", state=ReplicaState.STANDBY),
                load("x", state=ReplicaState.DRAINING), load("a", 50, 50, 1.0)], REQ)
    assert d.ranked == ("a",)


def test_no_active_replica_gives_empty_ranking_with_reason():
    d = choose([load("s", state=ReplicaState.STARTING)], REQ)
    assert d.ranked == () and "no active replica" in d.reason


def test_prefix_affinity_wins_within_slack_and_yields_beyond_it():
    req = RouteRequest(100, 50, prefix_hashes=(7,))
    near = choose([load("a", 0), load("b", 3, 1, prefixes={7})], req, affinity_slack=4)
    assert near.ranked == ("b", "a") and "prefix affinity" in near.reason
    far = choose([load("a", 0), load("b", 3, 2, prefixes={7})], req, affinity_slack=4)
    assert far.ranked[0] == "a" and "skipped" in far.reason
    no_hash = choose([load("a", 0), load("b", 3, prefixes={7})], REQ)
    assert no_hash.ranked[0] == "a"


def test_the_longest_cached_prefix_wins_then_the_least_loaded_among_equals():
    req = RouteRequest(100, 50, prefix_hashes=(1, 2, 3, 4))
    reps = [load("sys", 0, 0, prefixes={1, 2}), load("conv", 0, 5, prefixes={1, 2, 3}),
            load("other", 0, 0, prefixes={9})]
    d = choose(reps, req)
    assert d.ranked == ("conv", "other", "sys") and "holds 3/4" in d.reason
    both = [load("x", 0, 6, prefixes={1, 2}), load("y", 0, 2, prefixes={1, 2}), load("z", 0, 0)]
    d = choose(both, req)
    assert d.ranked[0] == "y" and "least loaded of the 2" in d.reason


def test_matched_blocks_is_the_leading_run_of_a_prefix_closed_set():
    assert matched_blocks((), {1}) == 0
    assert matched_blocks((5, 6, 7), {1}) == 0
    assert matched_blocks((5, 6, 7), {5, 6, 7, 8}) == 3
    assert matched_blocks((5, 6, 7, 8), {5, 6}) == 2


@given(st.lists(st.integers(0, 50), min_size=0, max_size=40, unique=True), st.integers(0, 40))
def test_matched_blocks_equals_a_walk_from_the_start(hashes, k):
    cached = set(hashes[:k]) | {1000}
    walk = next((i for i, h in enumerate(hashes) if h not in cached), len(hashes))
    assert matched_blocks(tuple(hashes), cached) == walk


@given(st.integers(2, 50), st.integers(0, 2**70))
def test_two_choices_are_two_distinct_indices_in_range(n, salt):
    i, j = two_choices(n, salt)
    assert 0 <= i < n and 0 <= j < n and i != j


loads = st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20), st.floats(0, 1),
                           st.sampled_from(list(ReplicaState))), min_size=0, max_size=12)


ROUTERS_UNDER_TEST = (choose, round_robin, power_of_two, least_loaded)


@given(loads, st.integers(0, 10**6), st.lists(st.integers(0, 5), max_size=6))
def test_every_router_ranks_the_active_replicas_pick_first_then_least_loaded(rows, salt, hashes):
    reps = [load(f"r{i}", w, r, kv, s, frozenset(range(i % 4))) for i, (w, r, kv, s) in enumerate(rows)]
    active = [r for r in reps if r.state is ReplicaState.ACTIVE]
    by_id = {r.replica_id: r for r in reps}
    for router in ROUTERS_UNDER_TEST:
        d = router(reps, RouteRequest(10, 10, prefix_hashes=tuple(hashes), salt=salt))
        assert sorted(d.ranked) == sorted(r.replica_id for r in active) and d.reason
        keys = [(by_id[i].waiting, by_id[i].running, by_id[i].kv_usage, i) for i in d.ranked[1:]]
        assert keys == sorted(keys)


@given(loads, st.integers(0, 10**6), st.integers(0, 40))
def test_choose_never_picks_past_the_slack_nor_the_most_loaded_of_several_without_a_prefix(rows, salt, slack):
    reps = [load(f"r{i}", w, r, kv, s, frozenset({1}) if i % 2 else frozenset()) for i, (w, r, kv, s) in enumerate(rows)]
    active = [r for r in reps if r.state is ReplicaState.ACTIVE]
    if not active:
        return
    for hashes in ((), (1,)):
        d = choose(reps, RouteRequest(10, 10, prefix_hashes=hashes, salt=salt), affinity_slack=slack)
        pick = next(r for r in active if r.replica_id == d.ranked[0])
        floor = min(r.waiting + r.running for r in active)
        assert pick.waiting + pick.running <= floor + slack
        near = sorted((r for r in active if r.waiting + r.running <= floor + slack), key=load_key)
        if not hashes and len(near) > 2:
            assert pick is not near[-1]


def test_round_robin_cycles_the_active_replicas_in_id_order():
    reps = [load("b", 9), load("a", 0), load("s", state=ReplicaState.STANDBY), load("c", 5)]
    picks = [round_robin(reps, RouteRequest(1, 1, salt=k)).ranked[0] for k in range(6)]
    assert picks == ["a", "b", "c", "a", "b", "c"]


def test_power_of_two_takes_the_one_with_fewer_ongoing_requests_of_the_two_drawn():
    reps = [load("a", 0, 5), load("b", 3, 0), load("c", 1, 1), load("d", 0, 9)]
    ongoing = {"a": 5, "b": 3, "c": 2, "d": 9}
    ids = sorted(ongoing)
    for salt in range(30):
        i, j = two_choices(4, salt)
        want = min((ids[i], ids[j]), key=lambda r: (ongoing[r], r != ids[i]))
        assert power_of_two(reps, RouteRequest(1, 1, salt=salt)).ranked[0] == want
    assert power_of_two([load("a", 3)], REQ).ranked == ("a",)
    assert power_of_two([], REQ).ranked == ()
