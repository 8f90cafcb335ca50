"""Property tests of the simulator: conservation, KV capacity, and the roofline bound."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.capacity.sim.cluster_sim import SimCluster, simulate
from hbmserve.core.config import SloSeconds
from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, cost_model

DEP = Deployment(load_model_shape("llama-3.1-8b"), get_gpu("l40s"))
COST = cost_model(DEP)
MAX_LEN = 1024


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 40))
    gaps = draw(st.lists(st.floats(0.0, 2.0), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 700), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 400), min_size=n, max_size=n))
    with_hashes = draw(st.booleans())
    hashes = tuple(tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=4))) for _ in range(n)) \
        if with_hashes else None
    arr = Arrivals(np.cumsum(gaps), np.array(prompts, dtype=np.int64), np.array(outputs, dtype=np.int64), hashes)
    chunked = draw(st.booleans())
    budget = draw(st.sampled_from([64, 256, 2048])) if chunked else draw(st.sampled_from([MAX_LEN, 2048]))
    cfg = EngineConfig(
        num_blocks=draw(st.integers(MAX_LEN // 16, 400)), block_size=16,
        max_num_seqs=draw(st.integers(1, 32)), max_num_batched_tokens=budget, max_model_len=MAX_LEN,
        enable_chunked_prefill=chunked, enable_prefix_caching=with_hashes, hash_block_tokens=64,
        preemption_mode=draw(st.sampled_from(["recompute", "swap"])),
        swap_space_tokens=draw(st.sampled_from([0, 500, 100_000])),
        max_coalesced_steps=draw(st.sampled_from([1, 7, 1024])))
    return arr, cfg, draw(st.integers(1, 3))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_request_finishes_exactly_once_and_kv_never_overflows(case):
    arr, cfg, replicas = case
    res = simulate(SimCluster(DEP, cfg, replicas, SloSeconds()), arr)
    s = res.summary
    too_long = int(np.count_nonzero(arr.prompt + arr.output > cfg.max_model_len))
    assert s.rejected == too_long
    assert s.finished + s.rejected == len(arr)
    assert s.unfinished == 0
    assert s.output_tokens == int(arr.output[arr.prompt + arr.output <= cfg.max_model_len].sum())
    for r in res.replicas:
        assert r.max_used_blocks <= r.num_blocks


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_throughput_never_exceeds_the_roofline(case):
    arr, cfg, replicas = case
    res = simulate(SimCluster(DEP, cfg, replicas, SloSeconds()), arr)
    roof = COST.roofline_tokens_per_s()
    floor = COST.min_step_time()
    for r in res.replicas:
        assert r.tokens_processed <= r.busy_s * roof * (1 + 1e-9)
        assert r.busy_s >= r.steps * floor * (1 - 1e-9)
        assert r.busy_s <= r.lifetime_s * (1 + 1e-9)
    if res.summary.finished:
        assert res.summary.output_tok_s <= replicas * roof


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(0, 2**31 - 1))
def test_first_token_precedes_finish_and_latencies_are_positive(n, seed):
    rng = np.random.default_rng(seed)
    arr = Arrivals(np.sort(rng.uniform(0, 10, n)), rng.integers(1, 500, n), rng.integers(1, 300, n))
    cfg = EngineConfig(num_blocks=200, max_num_seqs=8, max_num_batched_tokens=512, max_model_len=MAX_LEN)
    s = simulate(SimCluster(DEP, cfg, 1, SloSeconds()), arr).summary
    assert s.ttft.p50 is not None and s.ttft.p50 > 0
    assert s.e2e.p99 >= s.ttft.p99 - 1e-12 or s.e2e.p50 >= s.ttft.p50
