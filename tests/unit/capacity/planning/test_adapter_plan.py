"""Sizing LoRA slots (capacity/planning/adapter_plan.py): each (GPU slots, host slots) simulated to
its fewest replicas, the pick and its reason, and the pick's dollars split per adapter so that they
sum to the fleet's, a cold adapter paying more per token than a hot one."""

from __future__ import annotations

import dataclasses
import math

import pytest

from hbmserve.capacity.perf.hardware import load_catalog
from hbmserve.capacity.perf.lora import lora_cost
from hbmserve.capacity.perf.scenario import scenario_for
from hbmserve.capacity.planning.adapter_plan import (BASE, SlotOption, _pick, hot_and_tail, plan_adapter_slots,
                                                     slot_candidates)
from hbmserve.capacity.sim.cluster_sim import SimCluster, simulate
from hbmserve.capacity.traces.adapter_trace import AdapterTraceSpec, adapter_arrivals
from hbmserve.core.config import ModelSpec, SloSeconds

MODEL = ModelSpec.model_validate({
    "name": "m8", "source": "meta-llama/Llama-3.1-8B-Instruct", "engine": "vllm-gpu",
    "engine_settings": {"max_model_len": 8192}, "hardware": {"gpu": "h100-sxm", "usd_per_gpu_hour": 3.0},
    "sim": {"model_config_name": "llama-3.1-8b"}, "slo": {"ttft_p95_ms": 500, "tpot_p95_ms": 50}})
SC = scenario_for(MODEL, load_catalog())
# 16 adapters, Zipf 1, 20 req/s for 20 s: about 400 requests, under a second a plan.
TRACE = adapter_arrivals(AdapterTraceSpec(adapters=16, rate_rps=20, duration_s=20), seed=0)
PER_S = 3.0 / 3600  # one GPU a replica


@pytest.fixture(scope="module")
def plan():
    return plan_adapter_slots(SC, TRACE, rank=16, gpu_slots=(2, 8))


def test_candidates_are_gpu_slots_up_to_the_adapters_and_host_slots_their_multiples_and_all():
    assert slot_candidates(50, (1, 4, 16)) == [
        (16, 50), (16, 32), (16, 16), (4, 50), (4, 32), (4, 16), (4, 8), (4, 4),
        (1, 50), (1, 8), (1, 4), (1, 2), (1, 1)]
    # More GPU slots than adapters asked: every adapter in a slot is tried instead.
    assert slot_candidates(50, (4, 64)) == [(50, 50), (4, 50), (4, 32), (4, 16), (4, 8), (4, 4)]
    assert slot_candidates(3, (1, 2, 4)) == [(3, 3), (2, 3), (2, 2), (1, 3), (1, 2), (1, 1)]


def test_too_few_gpu_slots_miss_the_slo_where_enough_meet_it(plan):
    by = {(o.max_loras, o.max_cpu_loras): o for o in plan.options}
    assert set(by) == set(slot_candidates(16, (2, 8)))
    assert plan.best.max_loras == 8 and plan.best.meets_slo
    assert plan.best.ttft_p95_s <= 0.5 and plan.best.tpot_p95_s <= 0.05
    # Two GPU slots a replica: requests for a third adapter wait for one to go idle. More replicas
    # than the pick's do not make up for it within the counts tried.
    starved = [o for o in plan.options if o.max_loras == 2]
    assert not any(o.meets_slo for o in starved)
    assert min(o.replicas for o in starved) > plan.best.replicas
    assert min(o.ttft_p95_s for o in starved) > 0.5
    assert f"2 GPU slots starve the batch (TTFT p95 {min(o.ttft_p95_s for o in starved):.3g} s" in plan.reason
    # Each row's dollars are its fleet's replica time over the trace's tokens.
    tokens = int(TRACE.prompt.sum() + TRACE.output.sum())
    for o in plan.options:
        assert o.usd_per_mtok == pytest.approx(o.usd / tokens * 1e6)


def test_per_adapter_dollars_sum_to_the_fleets_and_each_pays_its_own_loads(plan):
    costs = plan.adapters
    assert sum(c.usd_input + c.usd_output for c in costs) == pytest.approx(plan.best.usd, rel=1e-12)
    assert sum(c.requests for c in costs) == len(TRACE) and all(c.adapter != BASE for c in costs)
    assert sum(c.input_tokens for c in costs) == TRACE.prompt.sum()
    # Output tokens share one price: only loads make one adapter's token dearer than another's.
    out = {round(c.usd_output / c.output_tokens, 15) for c in costs}
    assert len(out) == 1
    # A load is storage -> host then host -> GPU slot; an adapter back into a GPU slot from the
    # host cache pays the copy alone. So each adapter's load seconds are `loads` full loads plus a
    # whole number of copies, at the replica's price.
    lc = lora_cost(SC.deployment, plan.best.max_loras, plan.best.max_cpu_loras, 16)
    for c in costs:
        copies = (c.load_usd / PER_S - c.loads * (lc.storage_load_s + lc.host_load_s)) / lc.host_load_s
        assert copies == pytest.approx(round(copies), abs=1e-6) and round(copies) >= 0, c


def test_a_cold_adapter_pays_more_per_input_token_than_a_hot_one(plan):
    hot, cold = plan.adapters[0], plan.adapters[-1]
    assert hot.requests > 5 * cold.requests and cold.loads >= 1
    assert cold.usd_per_mtok_input > hot.usd_per_mtok_input
    # Without its loads each would pay the same per input token: the gap is the loads alone.
    base = [(c.usd_input - c.load_usd) / c.input_tokens for c in (hot, cold)]
    assert base[0] == pytest.approx(base[1])
    assert cold.usd_per_mtok_input - hot.usd_per_mtok_input == pytest.approx(
        (cold.load_usd / cold.input_tokens - hot.load_usd / hot.input_tokens) * 1e6)


def test_the_tail_row_sums_the_cold_adapters(plan):
    rows = hot_and_tail(plan.adapters, top=3)
    assert [r.adapter for r in rows[:3]] == [c.adapter for c in plan.adapters[:3]]
    tail = rows[3]
    assert tail.adapter == f"{len(plan.adapters) - 3} others"
    rest = plan.adapters[3:]
    assert tail.requests == sum(c.requests for c in rest) and tail.loads == sum(c.loads for c in rest)
    assert tail.usd_input + tail.usd_output == pytest.approx(sum(c.usd_input + c.usd_output for c in rest))


def loads_by_host_slots(zipf_s: float, hosts: tuple[int, ...]) -> dict[int, int]:
    """Adapter loads on two replicas with ample GPU slots, per host slots a replica."""
    arr = adapter_arrivals(AdapterTraceSpec(adapters=32, zipf_s=zipf_s, rate_rps=15, duration_s=30), seed=1)
    out = {}
    for h in hosts:
        eng = dataclasses.replace(SC.engine, lora=lora_cost(SC.deployment, 8, h, 16))
        out[h] = simulate(SimCluster(SC.deployment, eng, 2, SloSeconds(0.5, 0.05)), arr).summary.adapter_loads
    return out


def test_higher_skew_needs_fewer_host_slots_for_the_same_loads():
    hosts = (8, 12, 16, 24, 32)
    flat, steep = loads_by_host_slots(0.3, hosts), loads_by_host_slots(1.5, hosts)
    # With every adapter resident each loads once per replica it is sent to, whatever the skew.
    assert flat[32] <= 64 and steep[32] <= 64
    for h in hosts[:-1]:  # fewer slots than adapters: the cold tail is evicted and comes back
        assert steep[h] < flat[h], (h, flat, steep)

    def enough(loads: dict[int, int]) -> int:  # the fewest host slots within 20% of the fewest loads
        return min(h for h in hosts if loads[h] <= 1.2 * min(loads.values()))
    assert enough(steep) < enough(flat), (flat, steep)


def _opt(g: int, h: int, replicas: int, ok: bool, ttft: float, loads: float = 10.0) -> SlotOption:
    return SlotOption(g, h, replicas, ok, ttft, 0.02, 1.0 if ok else 0.5, loads, replicas * 1.0, replicas * 0.1)


def test_the_pick_is_the_fewest_slots_among_the_cheapest_and_the_reason_says_why():
    options = [_opt(16, 64, 4, True, 0.05, 10), _opt(8, 64, 4, True, 0.07, 10), _opt(8, 32, 4, True, 0.08, 11),
               _opt(8, 8, 4, True, 0.1, 90), _opt(4, 64, 6, False, 12.0)]
    best, why = _pick(options, host_gib_per_slot=0.025, adapters=64)
    # 8 GPU slots cost what 16 do; 32 host slots load within 20% of 64's, 8 do not.
    assert (best.max_loras, best.max_cpu_loras) == (8, 32)
    assert why == ("8 GPU slots and 32 host slots (0.80 GiB of host memory) a replica: 4 replicas at $0.400/Mtok, "
                   "11 adapter loads/min; 4 GPU slots starve the batch (TTFT p95 12 s on 6 replicas); 16 buy nothing; "
                   "8 host slots reload 90 adapters/min")
    best, why = _pick([_opt(4, 8, 6, False, 3.0), _opt(2, 8, 6, False, 9.0)], 0.025, 8)
    assert best.max_loras == 4 and why.startswith("no slot setting meets the SLO")
    assert math.isclose(_pick([_opt(2, 8, 3, True, 0.1)], 0.025, 8)[0].usd, 3.0)


def test_a_trace_without_adapters_is_refused():
    with pytest.raises(ValueError, match="names no adapter"):
        plan_adapter_slots(SC, dataclasses.replace(TRACE, adapters=None, adapter_names=()), 16)
