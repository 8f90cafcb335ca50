"""The planner: search size, feasibility, blockers, simulated confirmation, the analytic estimate."""

from __future__ import annotations

import pytest

from hbmserve.capacity.arrivals import gamma_arrivals
from hbmserve.sim.cluster_sim import SLOSpec
from hbmserve.capacity.hardware import get_gpu, load_catalog
from hbmserve.capacity.model_shape import load_model_shape
from hbmserve.capacity.perf_model import Deployment, cost_model, memory_fit
from hbmserve.capacity.plan_analytic import EngineKnobs, Workload, estimate
from hbmserve.sim.planner import SearchSpace, _configs, plan, workload_of

M8 = load_model_shape("llama-3.1-8b")
LOAD = gamma_arrivals(2.0, 60.0, 1.0, prompt_tokens=500, output_tokens=100, length_cv=0.3, seed=7)
SMALL = SearchSpace(tps=(1, 2), pps=(1,), quantizations=(None, "fp8"), max_num_seqs=(64, 256),
                    max_num_batched_tokens=(2048,), chunked_prefill=(True,))
PLAN_KEYS = {"gpu", "tp", "pp", "replicas", "warm_replicas", "quantization", "max_num_seqs",
             "max_num_batched_tokens", "chunked_prefill", "ttft_p95_s", "tpot_p95_s", "usd_per_hour",
             "usd_per_mtok", "feasible", "reason"}


def test_default_search_space_exceeds_200_configurations():
    gpus = [g for n, g in load_catalog().items() if n != "cpu-local"]
    n = len(list(_configs(gpus, load_model_shape("llama-3.1-70b"), SearchSpace())))
    # 5 GPUs x TP{1,2,4,8} x PP{1,2} x 4 formats x 3 max_num_seqs x 2 budgets x chunked on/off
    assert n == 5 * 4 * 2 * 4 * 3 * 2 * 2 >= 200


def test_feasible_plan_is_confirmed_by_simulation_and_meets_the_slo():
    slo = SLOSpec(2.0, 0.1)
    res = plan(M8, [get_gpu("h100-sxm"), get_gpu("l40s")], LOAD, slo, SMALL, confirm_top=2)
    assert res.feasible and res.simulated >= 1
    top = res.plans[0]
    assert top.source == "simulated" and top.feasible
    assert top.ttft_p95_s <= slo.ttft_s and top.tpot_p95_s <= slo.tpot_s
    assert PLAN_KEYS <= set(top.to_json_dict())
    assert top.usd_per_hour == pytest.approx((top.replicas + top.warm_replicas) * top.tp * top.pp
                                             * get_gpu(top.gpu).usd_per_gpu_hour)
    costs = [p.usd_per_mtok for p in res.plans if p.feasible and p.source == "simulated"]
    assert all(b >= a / 1.02 for a, b in zip(costs, costs[1:]))  # cheapest first, 2% counts as a tie
    assert top.gpu in res.why and "$" in res.why


def test_impossible_tpot_is_infeasible_with_the_blocker_named():
    res = plan(M8, [get_gpu("h100-sxm")], LOAD, SLOSpec(2.0, 0.001), SMALL, confirm_top=1)
    assert not res.feasible
    assert "TPOT" in res.plans[0].reason
    assert res.why.startswith("No configuration meets")


def test_weights_that_do_not_fit_are_reported():
    res = plan(load_model_shape("llama-3.1-405b"), [get_gpu("l40s")], LOAD, SLOSpec(5.0, 0.5),
               SearchSpace(tps=(1,), pps=(1,), quantizations=(None,), max_num_seqs=(64,),
                           max_num_batched_tokens=(2048,), chunked_prefill=(True,)), confirm_top=1)
    assert not res.feasible and "weights need" in res.plans[0].reason


def test_workload_peak_is_at_least_the_mean():
    w = workload_of(LOAD)
    assert w.peak_rps >= w.rate_rps == pytest.approx(len(LOAD) / LOAD.duration_s)


def test_analytic_estimate_grows_with_load_and_overloads():
    dep = Deployment(M8, get_gpu("h100-sxm"))
    c = cost_model(dep)
    k = EngineKnobs(256, 2048, True, memory_fit(dep).kv_tokens)
    w = Workload(1.0, 1.0, 1000, 200, 2000, 3000)
    light, heavy, crazy = (estimate(c, k, w, r) for r in (0.1, 10.0, 1000.0))
    assert light.tpot_p95_s < heavy.tpot_p95_s and light.ttft_p95_s < heavy.ttft_p95_s
    assert not light.overloaded and crazy.overloaded
    # At light load a step carries about one decode: close to the batch-1 step time.
    assert light.step_s == pytest.approx(float(c.step_time(1, 1100)), rel=0.2)


def test_costs_within_two_percent_tie_and_headroom_breaks_the_tie():
    from hbmserve.sim.planner import PlanCandidate, _rank_by_cost_then_headroom

    def cand(usd, tpot):
        return PlanCandidate("h100-sxm", 1, 1, 1, 0, "bf16", 64, 2048, True, 0.5, tpot, 3.0, usd, True, "")

    slo = SLOSpec(1.0, 0.1)
    a, b, c = cand(1.00, 0.095), cand(1.01, 0.050), cand(1.10, 0.010)
    assert _rank_by_cost_then_headroom([c, a, b], slo) == [b, a, c]
