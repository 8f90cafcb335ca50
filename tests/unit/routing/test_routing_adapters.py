"""LoRA adapters in routing (issue 25): which adapters a replica keeps (capacity/perf/lora.py
`place_adapter`, the one function the live replica and the simulated engine both call) and `choose` preferring
replicas that hold the request's adapter, loading it elsewhere only when they are too busy."""

from __future__ import annotations

import pytest

from hbmserve.core.routing import ReplicaLoad, RouteRequest
from hbmserve.core.scaling import ReplicaState
from hbmserve.capacity.perf.lora import place_adapter
from hbmserve.routing.choose import choose
from hbmserve.routing.routers import ROUTERS


def test_a_resident_adapter_loads_nothing_and_a_free_slot_evicts_nothing():
    assert place_adapter("a", ("a", "b"), {}, 2) == place_adapter("a", ("b", "a"), {"a": 3}, 2)
    hit = place_adapter("a", ("a", "b"), {}, 2)
    assert hit.resident and hit.fits and hit.evict == ()
    free = place_adapter("c", ("a",), {}, 2)
    assert not free.resident and free.fits and free.evict == () and "1/2 slots" in free.reason


def test_full_slots_evict_the_least_recently_used_idle_adapter():
    p = place_adapter("d", ("a", "b", "c"), {"a": 1}, 3)
    assert p.fits and p.evict == ("b",), "a is busy; b is the least recently used idle one"


def test_all_busy_the_request_waits_unless_the_caller_overcommits():
    busy = {"a": 1, "b": 2}
    wait = place_adapter("c", ("a", "b"), busy, 2)
    assert not wait.fits and "waits" in wait.reason
    over = place_adapter("c", ("a", "b"), busy, 2, overcommit=True)
    assert over.fits and over.evict == () and "over the 2 slots" in over.reason
    # An over-committed set shrinks back as soon as adapters go idle: two leave for one new.
    assert place_adapter("d", ("a", "b", "c"), {"c": 1}, 2).evict == ("a", "b")


A = ReplicaState.ACTIVE


def rep(rid, adapters=(), waiting=0, running=0, slots=4):
    return ReplicaLoad(rid, A, waiting=waiting, running=running, adapters=frozenset(adapters), adapter_slots=slots)


def ask(adapter, salt=0):
    return RouteRequest(100, 10, salt=salt, adapter=adapter)


def test_the_replica_holding_the_adapter_wins_over_a_less_loaded_one():
    d = choose([rep("idle"), rep("holder", ["sql"], running=5)], ask("sql"))
    assert d.ranked == ("holder", "idle") and "adapter sql loaded on 1" in d.reason


def test_a_holder_too_busy_loses_to_loading_it_where_a_slot_is_free():
    reps = [rep("holder", ["sql"], running=40), rep("full", "abcd", running=1), rep("free", "ab", running=2)]
    d = choose(reps, ask("sql"), adapter_slack=16)
    assert d.ranked[0] == "free", "the holder is 39 requests busier; `full` would have to evict"
    assert "only on replicas over 16 requests busier" in d.reason and "slot is free" in d.reason
    assert set(d.ranked) == {"holder", "full", "free"}, "every replica stays in the fallback ranking"


def test_with_no_free_slot_near_the_least_loaded_replica_loads_it():
    d = choose([rep("x", "abcd", running=3), rep("y", "efgh", running=1)], ask("sql"))
    assert d.ranked[0] == "y" and "evicting an idle one" in d.reason


def test_the_adapter_blind_router_and_base_requests_ignore_adapters():
    reps = [rep("idle"), rep("holder", ["sql"], running=5)]
    assert ROUTERS["choose-adapter-blind"](reps, ask("sql")).ranked[0] == "idle"
    assert choose(reps, ask(None)).ranked[0] == "idle"


@pytest.mark.parametrize("salt", range(20))
def test_among_holders_the_least_loaded_wins(salt):
    reps = [rep("a", ["sql"], running=3), rep("b", ["sql"], running=1), rep("c", running=0)]
    assert choose(reps, ask("sql", salt)).ranked[0] == "b"
