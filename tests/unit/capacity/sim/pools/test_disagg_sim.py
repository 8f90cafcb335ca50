"""Prefill/decode disaggregation in the simulator (issue 23): the KV transfer costed by bytes over
the link between the pools, the decode engine computing only the last prompt token of a request
whose KV arrived, and the two pools against one aggregated fleet of the same GPUs."""

from __future__ import annotations

import pytest

from hbmserve.capacity.perf.engine_core import EngineConfig, EngineCore, SimRequest
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, cost_model, kv_transfer_s, memory_fit
from hbmserve.capacity.sim.cluster_sim import SimCluster, simulate
from hbmserve.capacity.sim.pools.disagg_sim import DisaggCluster, Pool, simulate_disagg
from hbmserve.capacity.traces.arrivals import gamma_arrivals
from hbmserve.core.config import SloSeconds

DEP70 = Deployment(load_model_shape("llama-3.1-70b"), get_gpu("h100-sxm"), tp=4)


def test_the_transfer_is_the_kv_bytes_over_the_link_in_parallel_lanes():
    # Llama-3.1-70B: 2 x 80 layers x 8 KV heads x 128 x 2 bytes = 327,680 bytes a token.
    size = 8000 * 2 * 80 * 8 * 128 * 2
    nvlink = 450e9 * 4  # per GPU, 4 TP ranks each sending its shard
    assert kv_transfer_s(DEP70, DEP70, 8000, "nvlink") == pytest.approx(5e-6 + size / nvlink)
    assert kv_transfer_s(DEP70, DEP70, 8000, "infiniband") == pytest.approx(10e-6 + size / (50e9 * 4))
    # Through host memory: out over PCIe, then in again.
    assert kv_transfer_s(DEP70, DEP70, 8000, "host") == pytest.approx(2 * (20e-6 + size / (53e9 * 4)))
    tp2 = Deployment(DEP70.model, DEP70.gpu, tp=2)
    assert kv_transfer_s(DEP70, tp2, 8000, "nvlink") == pytest.approx(5e-6 + size / (450e9 * 2))
    with pytest.raises(ValueError, match="link must be one of nvlink, infiniband, host"):
        kv_transfer_s(DEP70, DEP70, 10, "carrier-pigeon")


def test_a_request_whose_kv_arrived_computes_only_its_last_prompt_token():
    core = EngineCore(EngineConfig(num_blocks=4096, max_model_len=8192), cost_model(DEP70))
    r = SimRequest(0, 0.0, 3000, 4)
    r.preloaded = 3000
    assert core.add(r)
    plan = core.plan()
    assert [c for _, c in plan.chunks] == [1], "one token for its logits, not 3,000"
    assert core.used_blocks == -(-3001 // 16), "the arrived KV holds blocks like computed KV"
    assert core.prefix_hit_tokens == 0, "transferred KV is not a prefix-cache hit"


def engine(budget: int) -> EngineConfig:
    return EngineConfig(num_blocks=memory_fit(DEP70).kv_tokens // 16, max_model_len=16384,
                        max_num_batched_tokens=budget, max_num_seqs=256)


def test_every_request_goes_through_both_pools_and_waits_for_its_transfer():
    arr = gamma_arrivals(1.0, 60, prompt_tokens=4000, output_tokens=50, seed=2)
    slow = DisaggCluster(Pool(DEP70, engine(16384), 1), Pool(DEP70, engine(16384), 1), "host")
    fast = DisaggCluster(Pool(DEP70, engine(16384), 1), Pool(DEP70, engine(16384), 1), "nvlink")
    a, b = simulate_disagg(slow, arr), simulate_disagg(fast, arr)
    assert a.summary.finished == b.summary.finished == len(arr)
    assert a.transferred_tokens == int(arr.prompt.sum())
    # Host memory is ~17x slower than NVLink here: TTFT grows by about the difference.
    extra = a.transfer_s - b.transfer_s
    assert extra > 0.005 and a.summary.ttft.p50 == pytest.approx(b.summary.ttft.p50 + extra, abs=0.01)
    assert a.summary.gpu_hours == pytest.approx(8 * a.summary.makespan_s / 3600)  # 2 replicas x TP 4


def test_splitting_keeps_tpot_under_a_strict_slo_where_one_fleet_mixing_long_prefills_cannot():
    """Long prompts, strict TPOT: on one fleet every long prefill chunk slows the decodes it runs
    beside; split, decode steps carry no prefill."""
    slo = SloSeconds(3.0, 0.03)
    arr = gamma_arrivals(3.0, 120, prompt_tokens=8000, output_tokens=200, length_cv=0.5, seed=1)
    agg = simulate(SimCluster(DEP70, engine(8192), 4, slo), arr).summary
    split = simulate_disagg(DisaggCluster(Pool(DEP70, engine(16384), 3), Pool(DEP70, engine(16384), 1),
                                          "nvlink", slo), arr).summary
    assert split.tpot.p95 < 0.03 < agg.tpot.p95
    assert split.slo_attainment > agg.slo_attainment + 0.1


def test_scaled_pools_start_late_bill_from_the_order_and_drain_without_loss():
    from hbmserve.capacity.sim.pools.disagg_sim import PoolScaling, PoolTargets

    arr = gamma_arrivals(2.0, 300, prompt_tokens=3000, output_tokens=100, seed=4)
    seen = []

    def scaler(view):
        seen.append(view)
        # Grow prefill to 3 at t=60 s, shrink both to 1 at t=200 s.
        return PoolTargets(3 if 60 <= view.now < 200 else 1, 2 if view.now < 200 else 1)

    spec = DisaggCluster(Pool(DEP70, engine(16384), 1), Pool(DEP70, engine(16384), 2), "nvlink")
    r = simulate_disagg(spec, arr, scaling=PoolScaling(scaler, startup_s=30.0))
    assert r.summary.finished == len(arr), "a drained replica finishes what it holds"
    assert r.timeline[:3] == ((0.0, 1, 2), (60.0, 3, 2), (200.0, 1, 1))
    # The two prefill replicas ordered at 60 s bill from 60 s and serve from 90 s.
    starting = [v for v in seen if 60 < v.now < 90][0]
    assert [x.state.value for x in starting.prefill.replicas].count("starting") == 2
    served = [v for v in seen if 95 < v.now < 199][0]
    assert [x.state.value for x in served.prefill.replicas] == ["active"] * 3
    assert 1 * 300 + 2 * 140 <= r.prefill_replica_s <= 1 * 330 + 2 * 150, "two extra replicas from 60 s to about 200 s"
    # The scaler sees the client's latencies, the prompt tokens arriving and the backlog.
    late = seen[-1]
    assert late.prefill.ttft_samples_s and late.decode.tpot_samples_s
    assert 0 < max(v.prompt_tokens_rps for v in seen) < 3 * 3000 * 2.0
    assert r.scale_actions == 3


def test_a_pool_keeps_one_serving_replica_whatever_the_scaler_says():
    from hbmserve.capacity.sim.pools.disagg_sim import PoolScaling, PoolTargets

    arr = gamma_arrivals(1.0, 60, prompt_tokens=1000, output_tokens=20, seed=5)
    spec = DisaggCluster(Pool(DEP70, engine(16384), 2), Pool(DEP70, engine(16384), 1), "nvlink")
    r = simulate_disagg(spec, arr, scaling=PoolScaling(lambda view: PoolTargets(0, 0), startup_s=30.0))
    assert r.summary.finished == len(arr)
    assert r.timeline[:2] == ((0.0, 2, 1), (1.0, 1, 1)) and r.timeline[-1][1:] == (1, 1)
