"""The warm tier's one node request (autoscale/warm_nodes.py): properties from what Ray's
`request_resources` means (a floor on the cluster's total resources, replaced by each call)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, strategies as st

from hbmserve.autoscale.warm_nodes import (ModelWish, cluster_request, live_warm_target, models_for_node,
                                           shape_of)
from hbmserve.core.records import WarmTierRecord

RESOURCES = ("GPU", "CPU", "accel_h100")
bundle = st.dictionaries(st.sampled_from(RESOURCES), st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]), max_size=3)
shape = st.lists(bundle, min_size=0, max_size=4).map(tuple)


@st.composite
def wishes(draw, min_size=0):
    names = draw(st.lists(st.text("abcxyz", min_size=1, max_size=4), min_size=min_size, max_size=5, unique=True))
    return [ModelWish(model=n, replica_shape=draw(shape), running=draw(st.integers(0, 6)),
                      target_active=draw(st.integers(0, 6)), hot=draw(st.integers(0, 3)),
                      warm=draw(st.integers(0, 3))) for n in names]


def _key(b: dict) -> tuple:
    return tuple(sorted(b.items()))


def _count(bundles) -> Counter:
    return Counter(_key(b) for b in bundles)


@given(wishes())
def test_never_less_than_the_serving_fleet(ws):
    got = _count(cluster_request(ws).bundles)
    need: Counter = Counter()
    for w in ws:
        for b in shape_of(w):
            need[_key(b)] += w.running
    assert not need - got, "a running replica's resources left out of the request"


@given(wishes())
def test_one_call_holds_every_models_wish(ws):
    """The request for all models is exactly the union of each model's alone: nothing is lost
    (a per-model call would erase the others) and nothing is double counted."""
    together = _count(cluster_request(ws).bundles)
    alone: Counter = Counter()
    for w in ws:
        alone += _count(cluster_request([w]).bundles)
    assert together == alone


@given(wishes(min_size=1), st.integers(1, 4), st.randoms())
def test_a_warm_node_is_one_replicas_bundles(ws, k, rnd):
    w = ws[0]
    with_warm = ModelWish(**{**w.__dict__, "warm": w.warm + k})
    extra = _count(cluster_request([with_warm, *ws[1:]]).bundles) - _count(cluster_request(ws).bundles)
    expected: Counter = Counter()
    for b in shape_of(w):
        expected[_key(b)] += k
    assert extra == expected
    shuffled = list(ws)
    rnd.shuffle(shuffled)
    assert cluster_request(shuffled) == cluster_request(ws)  # canonical: compare to call Ray only on change


def test_hand_worked_request():
    a = ModelWish(model="a", replica_shape=({"GPU": 1, "CPU": 1},), running=1, target_active=2, hot=1, warm=1)
    b = ModelWish(model="b", replica_shape=({"GPU": 1},) * 2, running=3, target_active=1, warm=0)
    sim = ModelWish(model="s", replica_shape=({"CPU": 0},), running=5, target_active=5, warm=2)
    req = cluster_request([sim, b, a])
    # a: max(1, 2 + 1) + 1 = 4 replicas of one bundle; b: max(3, 1) = 3 replicas of two bundles.
    assert req.bundles == ({"CPU": 1.0, "GPU": 1.0},) * 4 + ({"GPU": 1.0},) * 6
    assert "s: needs no node resources" in req.reason and "a: 4 x" in req.reason


def test_models_for_node_fit_one_bundle():
    shapes = {"big": ({"GPU": 8},), "one": ({"GPU": 1, "CPU": 1},), "pp": ({"GPU": 4},) * 2, "sim": ({},)}
    assert models_for_node({"GPU": 4, "CPU": 8}, shapes) == ("one", "pp")
    assert models_for_node({"CPU": 8}, shapes) == ()


def _tier(**kw) -> WarmTierRecord:
    return WarmTierRecord(**{"at": 100.0, "node_autoscaler": True, "warmable": ("engine-m",), "bundles": (),
                             "reason": "", **kw})


def test_the_live_warm_pool_is_real_only_with_an_aggregator_an_autoscaler_and_a_cache():
    assert live_warm_target(2, "engine-m", _tier(), now=101, ttl_s=10) == (2, "")
    assert live_warm_target(0, "engine-m", None, now=101, ttl_s=10) == (0, "")
    for tier, now, why in ((None, 101, "no warm-tier aggregator"), (_tier(), 200, "no warm-tier aggregator"),
                           (_tier(node_autoscaler=False), 101, "no node autoscaler"),
                           (_tier(warmable=()), 101, "through the cache")):
        n, reason = live_warm_target(2, "engine-m", tier, now=now, ttl_s=10)
        assert n == 0 and why in reason and reason.startswith("warm 2->0")
