"""Routing in the cluster simulator: the router sees each engine's real prefix cache, stale
stats herd a deterministic pick, and the prefix-routing benchmark runs and ranks `choose` first."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, memory_fit
from hbmserve.capacity.traces.prefix_trace import PrefixTraceSpec
from hbmserve.core.routing import ReplicaLoad, RouteDecision, RouteRequest
from hbmserve.ops.bench import prefix_routing
from hbmserve.routing.routers import least_loaded, round_robin
from hbmserve.routing.choose import choose
from hbmserve.capacity.sim.cluster_sim import SimCluster, simulate

DEP = Deployment(load_model_shape("llama-3.1-8b"), get_gpu("h100-sxm"), tp=1)
ENG = EngineConfig(num_blocks=20_000, max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=4096,
                   enable_prefix_caching=True, hash_block_tokens=16)


def arrivals(times, prompts, hashes) -> Arrivals:
    return Arrivals(np.asarray(times, float), np.asarray(prompts, np.int64), np.full(len(times), 4, np.int64),
                    tuple(hashes))


def test_the_router_sees_every_block_hash_and_the_engines_real_cache():
    seen: list[tuple[RouteRequest, list[ReplicaLoad]]] = []

    def spy(loads, request):
        seen.append((request, [ReplicaLoad(x.replica_id, x.state, x.waiting, x.running, x.kv_usage,
                                           frozenset(x.cached_prefixes)) for x in loads]))
        return choose(loads, request)

    conv = tuple(range(1, 11))  # 160 tokens in 10 blocks; the second turn extends it
    res = simulate(SimCluster(DEP, ENG, 3), arrivals([0.0, 5.0], [170, 250], [conv, conv + (11, 12, 13, 14, 15)]),
                   router=spy)
    (first, loads0), (second, loads1) = seen
    assert first.prefix_hashes == conv and first.salt == 0 and second.salt == 1
    assert all(not x.cached_prefixes for x in loads0)
    holder = [x for x in loads1 if x.cached_prefixes]
    assert len(holder) == 1 and holder[0].cached_prefixes == frozenset(conv)  # what the engine cached
    s = res.summary
    # The second turn went to the holder and read its 10 blocks (160 tokens) from the cache.
    assert (s.prompt_tokens, s.prefix_hit_tokens) == (420, 160)
    assert s.prefix_hit_rate == pytest.approx(160 / 420)


def test_stale_stats_send_a_burst_to_one_replica_fresh_stats_spread_it():
    burst = arrivals([0.0] * 6, [400] * 6, [()] * 6)

    def busy(res):
        return sum(1 for r in res.replicas if r.tokens_processed > 0)

    assert busy(simulate(SimCluster(DEP, ENG, 3), burst, router=least_loaded)) == 3
    assert busy(simulate(SimCluster(DEP, ENG, 3), burst, router=least_loaded, stats_interval_s=1.0)) == 1
    # choose's power-of-two fallback spreads even a stale burst.
    assert busy(simulate(SimCluster(DEP, ENG, 3), burst, router=choose, stats_interval_s=1.0)) > 1


TINY = prefix_routing.BenchConfig(
    prefix=PrefixTraceSpec(duration_s=60.0, session_rps=3.0, think_s=5.0), control_rps=2.0,
    seeds=(0, 1), stats_intervals_s=(0.1,), routers=("choose", "round-robin", "power-of-two"))


def test_the_benchmark_runs_and_choose_hits_the_cache_at_least_as_often(tmp_path):
    rows = prefix_routing.run(TINY)
    by = {(r.trace, r.router): r for r in rows}
    assert len(rows) == 2 * 3 and all(len(r.runs) == 2 for r in rows)
    for seed in range(2):
        hit = {name: by[("prefix-heavy", name)].runs[seed]["prefix_hit_rate"] for name in TINY.routers}
        assert hit["choose"] >= hit["round-robin"] and hit["choose"] >= hit["power-of-two"]
        assert all(r.runs[seed]["finished"] == r.runs[seed]["requests"] for r in rows)
    assert by[("no shared prefix", "choose")].median("prefix_hit_rate") == 0.0
    js, md = prefix_routing.write(rows, TINY, tmp_path, 1.0)
    doc = json.loads(js.read_text())
    assert [r["router"] for r in doc["rows"]] == [r.router for r in rows]
    assert "| prefix-heavy | <= 0.1 s | choose |" in md.read_text()


def test_round_robin_in_the_simulator_takes_turns():
    picks: list[str] = []

    def spy(loads, request) -> RouteDecision:
        d = round_robin(loads, request)
        picks.append(d.ranked[0])
        return d

    simulate(SimCluster(DEP, ENG, 3), arrivals([0.0, 0.1, 0.2, 0.3], [100] * 4, [()] * 4), router=spy)
    assert picks == ["r0", "r1", "r2", "r0"]


def test_adapter_aware_routing_loads_fewer_adapters_and_cuts_ttft_p95_on_zipf_traffic():
    """50 adapters, Zipf traffic, 4 replicas with 16 host slots each (64 >= 50): routing by
    adapter lets each replica keep its share resident; blind routing reloads on every replica."""
    from hbmserve.capacity.perf.lora import lora_cost
    from hbmserve.capacity.traces.adapter_trace import AdapterTraceSpec, adapter_arrivals
    from hbmserve.routing.routers import ROUTERS

    dep = Deployment(load_model_shape("llama-3.1-8b"), get_gpu("h100-sxm"))
    eng = EngineConfig(num_blocks=memory_fit(dep).kv_tokens // 16, max_model_len=8192,
                       lora=lora_cost(dep, 8, 16, 16))
    arr = adapter_arrivals(AdapterTraceSpec(rate_rps=20, duration_s=60), seed=0)
    aware = simulate(SimCluster(dep, eng, 4), arr, router=ROUTERS["choose"], stats_interval_s=0.1).summary
    blind = simulate(SimCluster(dep, eng, 4), arr, router=ROUTERS["choose-adapter-blind"],
                     stats_interval_s=0.1).summary
    assert aware.finished == blind.finished == len(arr)
    assert aware.adapter_loads < 0.25 * blind.adapter_loads
    for s in (aware, blind):  # per adapter, summed over replicas, most loads first
        assert sum(a.loads for a in s.adapter_loads_by) == s.adapter_loads
        assert [a.loads for a in s.adapter_loads_by] == sorted((a.loads for a in s.adapter_loads_by), reverse=True)
    assert aware.ttft.p95 < blind.ttft.p95
