"""The host-memory KV tier behind the prefix cache (capacity/perf/kv_blocks.py HostTier) and what the
engine does with its hits: counts them, loads them over PCIe, and publishes vLLM-style events."""

from __future__ import annotations

import pytest

from hbmserve.capacity.perf.engine_core import EngineConfig, EngineConfigError, EngineCore, SimRequest
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.kv_blocks import HostTier, PrefixCache
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, cost_model
from hbmserve.core.kv_events import BlockRemoved, BlockStored, Medium

COST = cost_model(Deployment(load_model_shape("llama-3.1-8b"), get_gpu("h100-sxm")))


def test_the_host_tier_keeps_the_newest_and_a_prefix_head_longest():
    events: list = []
    host = HostTier(4, events)
    host.touch((1, 2, 3))
    host.touch((7, 8))  # 5 hashes for 4 slots: the oldest, 3 (the tail of 1-2-3), goes
    assert set(host.cached) == {1, 2, 7, 8}
    assert host.run_from((1, 2, 3), 0) == 2 and host.run_from((9, 7, 8), 1) == 2
    assert events == [BlockStored((1, 2, 3), None, Medium.HOST), BlockStored((7, 8), None, Medium.HOST),
                      BlockRemoved((3,), Medium.HOST)]
    with pytest.raises(ValueError, match="capacity"):
        HostTier(0)


def test_the_prefix_cache_publishes_what_it_stores_and_evicts():
    cache = PrefixCache(1, publish=True)
    cache.acquire((1, 2, 3))
    cache.acquire((1, 2, 4))  # only 4 is new; its parent is 2
    cache.release((1, 2, 3))
    cache.release((1, 2, 4))
    cache.evict(2)
    assert cache.events == [BlockStored((1, 2, 3), None), BlockStored((4,), 2), BlockRemoved((3, 4))]  # 3 released first


def engine(host_tokens: int) -> EngineCore:
    return EngineCore(EngineConfig(num_blocks=64, block_size=16, max_num_batched_tokens=4096, max_model_len=1024,
                                   enable_prefix_caching=True, hash_block_tokens=16, host_kv_tokens=host_tokens,
                                   publish_kv_events=True), COST)


def run(c: EngineCore, r: SimRequest, t: float = 0.0) -> float:
    c.add(r)
    while c.has_work():
        p = c.plan()
        t += p.total_s
        c.commit(p, p.steps, t)
    return t


def test_blocks_evicted_from_hbm_come_back_from_the_host_tier_at_pcie_cost():
    a = tuple(range(100, 132))  # 32 blocks of 16 tokens: half of HBM
    warm = engine(host_tokens=4096)
    cold = engine(host_tokens=0)
    for c in (warm, cold):
        run(c, SimRequest(0, 0.0, 512, 1, a))
        run(c, SimRequest(1, 0.0, 1008, 1, tuple(range(200, 263))))  # fills HBM: a goes
        assert c.cache.match(a) == 0
    t0 = 0.0
    took_warm = run(warm, SimRequest(2, 0.0, 512, 1, a), t0)
    took_cold = run(cold, SimRequest(2, 0.0, 512, 1, a), t0)
    # 511 of 512 tokens found (the engine recomputes the last one), all loaded from the host tier.
    assert warm.host_hit_tokens == 511 and cold.host_hit_tokens == 0
    assert warm.prefix_hit_tokens == 511
    prefill_one = float(COST.step_time(0, 0.0, 1, 512, 512, 1))
    assert took_warm == pytest.approx(COST.swap_time(511) + prefill_one)
    assert took_cold > took_warm + 0.004  # computing 511 tokens costs more than copying them
    assert any(isinstance(e, BlockStored) and e.medium is Medium.HOST for e in warm.take_kv_events())
    assert warm.take_kv_events() == ()  # taken once


def test_a_host_tier_needs_prefix_caching():
    with pytest.raises(EngineConfigError, match="host_kv_tokens"):
        EngineConfig(num_blocks=64, max_model_len=1024, host_kv_tokens=1024)


def test_a_host_block_is_worth_most_of_an_hbm_one_on_a_pcie5_h100():
    v = COST.host_block_value(512)
    assert 0.8 < v < 1.0  # 8B: 64 MB per 512-token block over 53 GB/s vs its prefill


def _model(engine: str = "vllm-gpu", **settings) -> dict:
    return {"name": "m", "source": "meta-llama/Llama-3.1-8B-Instruct", "engine": engine, "replicas": 2,
            "hardware": {"gpu": "h100-sxm"}, "sim": {"model_config_name": "llama-3.1-8b"},
            "engine_settings": {"max_model_len": 8192, "dtype": "bfloat16", **settings}}


@pytest.mark.parametrize("engine, prefix_caching, tier", [
    ("vllm-gpu", True, True), ("sim", True, True),  # --kv-offloading-size behind the prefix cache
    ("vllm-gpu", False, False),  # no prefix cache, nothing for a tier to serve
    ("vllm-cpu", True, False),  # kv_offload_gib is the CPU engine's KV cache itself
])
def test_the_configured_host_tier_is_the_one_the_simulator_runs(engine, prefix_caching, tier):
    from hbmserve.capacity.perf.hardware import load_catalog
    from hbmserve.capacity.perf.scenario import scenario_for
    from hbmserve.core.config import parse_cluster_spec

    spec = parse_cluster_spec({"models": [_model(engine, enable_prefix_caching=prefix_caching, kv_offload_gib=64)]})
    sc = scenario_for(spec.models[0], load_catalog(), gpu_override="h100-sxm" if engine == "vllm-cpu" else None)
    per_tok = sc.deployment.model.kv_bytes_per_token_per_rank(1, 1)  # 128 KiB for Llama-3.1-8B in bf16
    assert sc.engine.host_kv_tokens == (int(64 * 2 ** 30 / per_tok) if tier else 0)


def test_a_host_tier_from_the_config_serves_what_hbm_evicted():
    """Sessions that come back after their blocks left HBM: the config's tier brings them back
    (the bound it can reach is the trace's infinite-cache one, simulate's third figure)."""
    from hbmserve.capacity.perf.hardware import load_catalog
    from hbmserve.capacity.perf.scenario import scenario_for
    from hbmserve.capacity.sim.cluster_sim import cluster_for, simulate
    from hbmserve.capacity.traces.prefix_trace import PrefixTraceSpec, prefix_arrivals
    from hbmserve.core.config import parse_cluster_spec

    trace = prefix_arrivals(PrefixTraceSpec(duration_s=300, session_rps=2.0, system_prompts=40, user_tokens=2000,
                                            think_s=60, max_context_tokens=8192, block_tokens=512), seed=1)
    hit = {}
    for gib in (1, 256):
        spec = parse_cluster_spec({"models": [_model(enable_prefix_caching=True, kv_offload_gib=gib,
                                                     gpu_memory_utilization=0.3)]})
        s = simulate(cluster_for(scenario_for(spec.models[0], load_catalog())), trace).summary
        hit[gib] = (s.prefix_hit_rate, s.host_hit_tokens)
    assert hit[256][0] > hit[1][0] + 0.05 and hit[256][1] > 0, hit
