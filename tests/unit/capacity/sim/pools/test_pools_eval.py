"""The two-pool policy evaluated in the simulator (issue 23 req 5): against fixed pool pairs, the
pools scaled apart, and the oracle, on one short bursty long-prompt trace."""

from __future__ import annotations

import pytest

from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment
from hbmserve.capacity.sim.pools.pools_eval import (capacities, evaluate_pools, pool_needs, pools_case, pools_config,
                                                    static_frontier)
from hbmserve.capacity.traces.burst_trace import BurstSpec, burst_arrivals
from hbmserve.core.config import SloSeconds

DEP70 = Deployment(load_model_shape("llama-3.1-70b"), get_gpu("h100-sxm"), tp=4)
SLO = SloSeconds(ttft_s=2.0, tpot_s=0.03)
ARR = burst_arrivals(BurstSpec(duration_s=360, base_rps=0.5, burst_rps=2.0, bursts=1, burst_s=120,
                               prompt_tokens=6000, output_tokens=200), seed=3)


@pytest.fixture(scope="module")
def case():
    return pools_case(DEP70, ARR, SLO, decode_seqs=64, max_prefill=3, max_decode=2)


def test_the_prefill_capacity_is_the_ttft_bound_rate_not_the_raw_token_rate(case):
    cap = capacities(case, ARR)
    raw = cap.prefill_tokens_s / cap.prompt_mean
    assert 0 < cap.prefill_rps < raw, "queueing within a 2 s TTFT leaves less than the raw rate"
    config = pools_config(case, cap)
    assert config.prefill.replica_capacity_rps == cap.prefill_rps
    assert config.decode.replica_capacity_rps == pytest.approx(cap.decode_tokens_s / cap.output_mean)
    assert config.prefill.tpot_p95_target_s is None and config.decode.tpot_p95_target_s == SLO.tpot_s
    assert (config.prefill.max_replicas, config.decode.max_replicas) == (3, 2)


def test_needs_carry_a_backlog_as_a_fluid():
    import numpy as np
    from hbmserve.capacity.traces.arrivals import Arrivals

    # 60k tokens in the first 10 s interval on replicas of 1k tokens/s: 6 replicas hold it. At
    # most 4 leave a backlog of 20k, which the next interval drains: 2 replicas clear it within
    # the interval and the 2 s drain (1 would leave 10k).
    arr = Arrivals(t=np.array([0.0, 1.0, 12.0]), prompt=np.array([30_000, 30_000, 10]), output=np.array([1, 1, 1]))
    assert pool_needs(arr, arr.prompt.astype(float), 1000.0, 6, 10.0, 2.0) == [6, 1]
    assert pool_needs(arr, arr.prompt.astype(float), 1000.0, 4, 10.0, 2.0) == [4, 2]


def test_one_policy_against_the_fixed_pools_and_the_oracle(case):
    ev = evaluate_pools(case, ARR)
    names = [r.name for r in ev.runs]
    assert names[:2] == ["one policy", "per pool"] and names[2].startswith("oracle")
    assert ev.oracle.slo_attainment >= ev.aim and ev.undercuts() == []
    for r in ev.runs:
        assert r.unfinished == 0, r.name
        assert r.gpu_hours > 0 and r.prefill_replica_h > 0 and r.decode_replica_h > 0
    # Scaled runs changed their pools; fixed ones did not.
    assert ev.runs[0].scale_actions > 0 and all(r.scale_actions == 0 for r in ev.runs if r.name.startswith("static"))
    if ev.cheapest_static is not None:
        assert ev.oracle.gpu_hours <= ev.cheapest_static.gpu_hours


def test_the_static_frontier_is_a_staircase(case):
    runs = static_frontier(case, ARR, aim=0.9)
    pairs = [tuple(int(x) for x in r.name.split()[1].split("+")) for r in runs]
    assert pairs[0] == (1, 2)
    kept = {}
    for (p, d), r in zip(pairs, runs):
        if r.slo_attainment >= 0.9:
            kept[p] = min(kept.get(p, d), d)
    ds = [kept[p] for p in sorted(kept)]
    assert ds == sorted(ds, reverse=True), "decode replicas only fall as prefill grows"
