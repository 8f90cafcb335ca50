"""The simulated router's picture of the caches (capacity/sim/kv_view.py): from the engines' KV events
through the KV index, or from what was routed; a lagging index is not trusted; a host tier
lifts the hit rate when HBM is short."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment
from hbmserve.core.routing import PrefixSource, ReplicaLoad, RouteRequest
from hbmserve.routing.choose import choose
from hbmserve.capacity.sim.cluster_sim import SimCluster, simulate
from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.capacity.traces.prefix_trace import PrefixTraceSpec, prefix_arrivals

DEP = Deployment(load_model_shape("llama-3.1-8b"), get_gpu("h100-sxm"), tp=1)
ENG = EngineConfig(num_blocks=20_000, max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=4096,
                   enable_prefix_caching=True, hash_block_tokens=16)


def two_turns(gap_s: float) -> Arrivals:
    conv = tuple(range(1, 11))
    return Arrivals(np.asarray([0.0, gap_s]), np.asarray([170, 250], np.int64), np.full(2, 4, np.int64),
                    (conv, conv + (11, 12, 13, 14, 15)))


def spy_on(seen: list):
    def spy(loads, request: RouteRequest):
        seen.append([frozenset(x.cached_prefixes) for x in loads])
        return choose(loads, request)
    return spy


@pytest.mark.parametrize("source", list(PrefixSource))
def test_both_sources_show_the_first_turn_where_it_went(source):
    seen: list = []
    res = simulate(SimCluster(DEP, ENG, 3), two_turns(5.0), router=spy_on(seen), prefix_source=source)
    holders = [s for s in seen[1] if s]
    assert holders == [frozenset(range(1, 11))]
    assert res.summary.prefix_hit_tokens == 160


def test_events_that_lag_past_the_bound_are_ignored_and_within_it_arrive_late():
    seen: list = []
    simulate(SimCluster(DEP, ENG, 3), two_turns(5.0), router=spy_on(seen), kv_event_lag_s=3.0)
    assert not any(seen[1])  # arrived 3 s behind: past the index's 2 s bound
    seen.clear()
    simulate(SimCluster(DEP, ENG, 3), two_turns(5.0), router=spy_on(seen), kv_event_lag_s=6.0)
    assert not any(seen[1])  # still in flight at t=5
    seen.clear()
    simulate(SimCluster(DEP, ENG, 3), two_turns(5.0), router=spy_on(seen), kv_event_lag_s=1.0)
    assert any(seen[1])  # arrived at ~1 s, 1 s behind: within the 2 s bound


def test_a_host_tier_recovers_most_of_what_a_short_hbm_loses():
    arr = prefix_arrivals(PrefixTraceSpec(duration_s=120, session_rps=3.0), seed=1)
    small = dataclasses.replace(ENG, num_blocks=600)
    hit = {}
    for name, eng in (("big", ENG), ("small", small), ("small+host", dataclasses.replace(small, host_kv_tokens=1 << 20))):
        s = simulate(SimCluster(DEP, eng, 2), arr).summary
        hit[name] = s.prefix_hit_rate
        if name == "small+host":
            assert s.host_hit_tokens > 0
    assert hit["small"] < hit["big"] - 0.1
    assert hit["small+host"] > hit["small"] + 0.8 * (hit["big"] - hit["small"])


def test_a_second_door_is_blind_to_what_the_first_routed_and_events_are_not():
    """Turn 2 of a conversation arrives at the other door (request ids 0 and 1: door 0, door 1).
    From what was routed, that door knows nothing of turn 1 and load decides; from the engines'
    events every door sees where turn 1's blocks are."""
    for source, expect_holder in ((PrefixSource.ROUTED, False), (PrefixSource.EVENTS, True)):
        seen: list = []
        simulate(SimCluster(DEP, ENG, 3), two_turns(5.0), router=spy_on(seen), prefix_source=source, doors=2)
        assert any(seen[1]) is expect_holder, source
    seen = []
    simulate(SimCluster(DEP, ENG, 3), two_turns(5.0), router=spy_on(seen), prefix_source=PrefixSource.ROUTED, doors=1)
    assert any(seen[1])  # one door remembers what it sent


def test_approximate_affinity_decays_with_doors_and_event_routing_does_not():
    # Short system prompts: most of what can be reused is a session's own history (0.63 hit with
    # events at either door count, routed 0.63 with one door and 0.43 with four, when written).
    arr = prefix_arrivals(PrefixTraceSpec(duration_s=120, session_rps=3.0, think_s=10.0, system_prompt_tokens=300.0,
                                          user_tokens=400.0, max_context_tokens=4096), seed=2)
    hit = {(src, d): simulate(SimCluster(DEP, ENG, 4), arr, prefix_source=src, doors=d).summary.prefix_hit_rate
           for src in PrefixSource for d in (1, 4)}
    assert hit[(PrefixSource.EVENTS, 1)] == hit[(PrefixSource.EVENTS, 4)]  # doors do not change what events show
    assert hit[(PrefixSource.ROUTED, 4)] < hit[(PrefixSource.ROUTED, 1)] - 0.1, hit
    assert hit[(PrefixSource.EVENTS, 4)] > hit[(PrefixSource.ROUTED, 4)] + 0.1, hit


def test_doors_must_be_at_least_one():
    with pytest.raises(ValueError, match="doors"):
        simulate(SimCluster(DEP, ENG, 2), two_turns(5.0), doors=0)
