"""Aggregated or split (capacity/planning/disagg_plan.py, break_even.py): each layout sized to its
fewest GPUs meeting the SLO in the simulator, ranked by $ per million tokens, the pick and why;
splitting wins where the TPOT leaves no room for a prefill chunk beside the decodes, one fleet
where each pool would idle; and where the winner changes as a knob sweeps."""

from __future__ import annotations

import dataclasses
import math

import pytest

from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, cost_model, memory_fit
from hbmserve.capacity.perf.slo_cap import batch_cap, chunk_step_s
from hbmserve.capacity.planning.break_even import BreakEvenPoint, crossovers
from hbmserve.capacity.planning.confirm import meets
from hbmserve.capacity.planning.disagg_plan import (AGGREGATED, PREFILL_BUDGET, SPLIT, TIE, ServingOption,
                                                    _fewest, _staircase, decode_seqs_cap, plan_disagg, pool_tps, rank)
from hbmserve.capacity.planning.planner import max_model_len_for
from hbmserve.capacity.sim.pools.disagg_sim import DisaggCluster, Pool, simulate_disagg
from hbmserve.capacity.sim.workload import workload_of
from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.traces.arrivals import gamma_arrivals
from hbmserve.core.config import SloSeconds

DEP70 = Deployment(load_model_shape("llama-3.1-70b"), get_gpu("h100-sxm"), tp=4)
# 90 s of long prompts at 3 req/s (about 270 requests); 60 s of chats at 10 req/s (about 600).
LONG = gamma_arrivals(3.0, 90, 1.0, 8000, 200, length_cv=0.5, seed=0)
CHAT = gamma_arrivals(10.0, 60, 1.0, 600, 300, length_cv=0.5, seed=0)
STRICT = SloSeconds(3.0, 0.015)
RELAXED = SloSeconds(3.0, 0.04)


@pytest.fixture(scope="module")
def long_strict():
    return plan_disagg(DEP70, LONG, STRICT, max_gpus=16)


@pytest.fixture(scope="module")
def chat_relaxed():
    return plan_disagg(DEP70, CHAT, RELAXED, max_gpus=16)


def test_splitting_wins_on_long_prompts_when_the_tpot_leaves_no_room_for_a_chunk(long_strict):
    plan = long_strict
    best, agg = plan.best, plan.best_of(AGGREGATED)
    assert best.kind == SPLIT and best.meets_slo
    assert best.tpot_p95_s <= STRICT.tpot_s and best.ttft_p95_s <= STRICT.ttft_s
    # Why: a TP4 step of one decode beside the smallest chunk the cap allows (256 tokens of an
    # 8k prompt) already takes longer than 15 ms, so TP4 cannot aggregate at all...
    w = workload_of(LONG)
    cap4 = batch_cap(cost_model(DEP70), STRICT.tpot_s, w, memory_fit(DEP70).kv_tokens)
    assert not cap4.feasible and cap4.step_s > STRICT.tpot_s
    # ...and no aggregated layout meets the SLO within 16 GPUs; the reason says so with its figures.
    assert not any(o.meets_slo for o in plan.options if o.kind == AGGREGATED)
    assert "its decode steps carry no prefill chunk" in plan.reason
    assert f"No aggregated layout meets it within 16 GPUs: the closest, {agg.layout}" in plan.reason
    assert f"TPOT p95 {agg.tpot_p95_s * 1e3:.1f} ms > 15 ms" in plan.reason
    assert f"on {best.gpus} GPUs at ${best.usd_per_mtok:.3f}/Mtok" in plan.reason


def test_the_split_is_sized_to_its_fewest_replicas(long_strict):
    """One prefill replica fewer misses the SLO (checked by simulating it here); one decode replica
    fewer is no layout (the pick has one)."""
    best = long_strict.best
    mml = max_model_len_for(DEP70.model, workload_of(LONG))
    pd, dd = (dataclasses.replace(DEP70, tp=t) for t in (best.tp, best.decode_tp))

    def engine(dep, seqs, budget):
        return EngineConfig(num_blocks=memory_fit(dep).kv_tokens // 16, max_num_seqs=seqs,
                            max_num_batched_tokens=budget, max_model_len=mml)

    assert best.decode_replicas == 1
    assert best.replicas > 1
    fewer = DisaggCluster(Pool(pd, engine(pd, 256, PREFILL_BUDGET), best.replicas - 1),
                          Pool(dd, engine(dd, best.max_num_seqs, PREFILL_BUDGET), 1), best.link, STRICT)
    assert not meets(simulate_disagg(fewer, LONG).summary, STRICT)


def test_one_fleet_wins_on_chats_where_split_pools_idle(chat_relaxed):
    """Ten chats a second fit one TP4 replica; a split needs two pools of at least one replica."""
    plan = chat_relaxed
    best, split = plan.best, plan.best_of(SPLIT)
    assert best.kind == AGGREGATED and best.meets_slo
    assert split.meets_slo and split.gpus > best.gpus and split.usd_per_mtok > best.usd_per_mtok * TIE
    # The split's pools are sized in whole replicas; the reason gives their busy shares.
    assert f"needs {split.gpus} GPUs at ${split.usd_per_mtok:.3f}/Mtok" in plan.reason
    assert f"its prefill pool is busy {split.prefill_busy:.0%}" in plan.reason
    assert split.prefill_busy < 1.0
    # The aggregated pick is the TPOT cap's or a budget whose steps fit the TPOT anyway.
    assert best.tpot_p95_s <= RELAXED.tpot_s


def test_options_rank_by_dollars_per_token_among_those_meeting_the_slo(long_strict, chat_relaxed):
    for plan, arr in ((long_strict, LONG), (chat_relaxed, CHAT)):
        tokens = int(arr.prompt.sum() + arr.output.sum())
        for o in plan.tried:  # the fleet's GPU-hours over the trace's span, at the catalog's $3/GPU-hour
            assert o.usd == pytest.approx(o.gpus * 3.0 * arr.duration_s / 3600)
            assert o.usd_per_mtok == pytest.approx(o.usd / tokens * 1e6)
            assert o.gpus == o.replicas * o.tp + o.decode_replicas * o.decode_tp
        met = [o for o in plan.options if o.meets_slo]
        assert list(plan.options[:len(met)]) == met, "every layout meeting the SLO ranks above every miss"
        if met:
            assert plan.best.usd_per_mtok <= min(o.usd_per_mtok for o in met) * TIE
        # Each layout's row is its cheapest run meeting the SLO.
        for o in met:
            same = [t for t in plan.tried if t.meets_slo and _layout_key(t) == _layout_key(o)]
            assert o.usd == min(t.usd for t in same)
        # The pick is no dearer than any run that met the SLO, whatever its layout.
        assert plan.best.usd <= min(t.usd for t in plan.tried if t.meets_slo) * TIE


def _layout_key(o: ServingOption) -> tuple:
    return o.kind, o.tp, o.decode_tp, o.max_num_seqs, o.max_num_batched_tokens


def _option(kind: str, usd: float | None, gpus: int = 8, met: bool = True, attained: float = 1.0,
            note: str = "") -> ServingOption:
    return ServingOption(kind, 4, 4, gpus // 4, 0, 64, 512, None, gpus, met, 1.0, 0.01, attained, 1.0,
                         usd or 0.0, usd, note=note)


def test_rank_puts_aggregated_first_within_two_percent_and_misses_after_every_meeting_layout():
    split_cheap = _option(SPLIT, 1.00)
    agg_tie = _option(AGGREGATED, 1.00 * TIE * 0.999)
    agg_dear = _option(AGGREGATED, 1.10)
    cheap_miss = _option(SPLIT, 0.50, met=False, attained=0.9)
    worse_miss = _option(AGGREGATED, 0.40, met=False, attained=0.5)
    unrun = _option(AGGREGATED, None, gpus=0, met=False, attained=0.0, note="cannot meet the TPOT")
    assert rank([unrun, worse_miss, agg_dear, cheap_miss, split_cheap, agg_tie]) == (
        agg_tie, split_cheap, agg_dear, cheap_miss, worse_miss, unrun)
    # Beyond 2% the cheaper split goes first.
    agg_over = _option(AGGREGATED, 1.00 * TIE * 1.01)
    assert rank([agg_over, split_cheap])[0] is split_cheap


def test_the_staircase_finds_the_cheapest_split_under_a_monotone_slo_in_few_runs():
    """Oracle: meets when prefill >= 3 and decode >= 2 (TP4 prefill, TP8 decode); cost in GPUs."""
    runs = []

    def run(p, d):
        runs.append((p, d))
        assert p * 4 + d * 8 <= 64, "never beyond the GPU budget"
        return dataclasses.replace(_option(SPLIT, p * 4 + d * 8, gpus=p * 4 + d * 8, met=p >= 3 and d >= 2),
                                   replicas=p, decode_replicas=d, decode_tp=8)

    best = _staircase(run, 4, 8, 64, least=1)
    assert (best.replicas, best.decode_replicas, best.meets_slo) == (3, 2, True)
    every = [(p, d) for p in range(1, 16) for d in range(1, 8) if p * 4 + d * 8 <= 64]
    assert len(runs) < len(every) / 3
    # Nothing fits: the closest miss comes back, marked as a miss.
    assert not _staircase(lambda p, d: _option(SPLIT, 1.0, met=False, attained=p / 10), 4, 4, 16, 1).meets_slo
    assert _staircase(run, 4, 8, 8, 1) is None, "one prefill and one decode replica need 12 GPUs"


def test_fewest_replicas_doubles_then_bisects():
    runs = []

    def run(n):
        runs.append(n)
        return _option(AGGREGATED, n, gpus=4 * n, met=n >= 5)

    assert _fewest(run, 1, 16).gpus == 20
    assert runs == [1, 2, 4, 8, 6, 5]
    runs.clear()
    assert _fewest(run, 3, 4).meets_slo is False and runs == [3, 4], "none meets: the largest tried"


def test_the_decode_pool_carries_the_most_sequences_whose_step_fits_the_tpot():
    w = workload_of(LONG)
    cost, kv = cost_model(DEP70), memory_fit(DEP70).kv_tokens
    ctx = w.prompt_mean + w.output_mean / 2
    for tpot in (0.02, 0.03, 0.05):
        n = decode_seqs_cap(cost, tpot, w, kv)
        assert n >= 1 and chunk_step_s(cost, n, n, ctx, 0) <= tpot
        assert n == kv // ctx or chunk_step_s(cost, n + 1, n + 1, ctx, 0) > tpot
    # One decode of an 8k context on TP4 alone takes longer than 15 ms: no decode pool of TP4 then.
    assert chunk_step_s(cost, 1, 1, ctx, 0) > 0.015 and decode_seqs_cap(cost, 0.015, w, kv) == 0


def test_pool_tps_add_twice_the_tp_within_a_node_else_half_where_it_fits():
    assert pool_tps(DEP70, 16384) == (4, 8)
    tp8 = dataclasses.replace(DEP70, tp=8)
    assert pool_tps(tp8, 16384) == (8, 4), "TP16 would leave the 8-GPU node: half instead"
    assert memory_fit(DEP70).kv_tokens < 500_000 <= memory_fit(tp8).kv_tokens
    assert pool_tps(tp8, 500_000) == (8,), "TP4 cannot hold one request of 500k tokens"


def test_bad_input_is_refused_naming_it():
    with pytest.raises(ValueError, match="link must be one of auto, nvlink, infiniband, host"):
        plan_disagg(DEP70, LONG, STRICT, link="carrier-pigeon")
    with pytest.raises(ValueError, match="TP2: .*leave no KV space"):
        plan_disagg(DEP70, LONG, STRICT, tps=(2, 4))
    with pytest.raises(ValueError, match="max GPUs 2 is below one replica's 4"):
        plan_disagg(DEP70, LONG, STRICT, max_gpus=2)


def _point(value: float, agg: float | None, split: float | None) -> BreakEvenPoint:
    a = _option(AGGREGATED, agg, met=agg is not None)
    s = _option(SPLIT, split, met=split is not None)
    winner = SPLIT if (agg is None or (split is not None and split * TIE < agg)) else AGGREGATED
    return BreakEvenPoint(value, 1.0, a, s, winner)


def test_each_crossover_is_where_the_cost_ratio_crosses_one_on_a_log_scale():
    pts = [_point(500, 1.0, 2.0), _point(2000, 1.0, 1.5), _point(8000, 1.5, 1.0)]
    # Between 2000 and 8000: log(1/1.5) rises to log(1.5/1), crossing zero halfway on log(prompt).
    assert crossovers(pts) == pytest.approx((math.sqrt(2000 * 8000),))
    asym = [_point(1000, 1.0, 2.0), _point(4000, 1.5, 1.0)]
    t = math.log(2) / (math.log(2) + math.log(1.5))
    assert crossovers(asym) == pytest.approx((math.exp(math.log(1000) + t * math.log(4)),))
    # One side missed at the far point: the geometric mean of the two.
    assert crossovers([_point(10, 1.0, 1.2), _point(40, None, 1.0)]) == pytest.approx((20.0,))
    assert crossovers([_point(10, 1.0, 1.2), _point(40, 1.0, 1.3)]) == ()
    # A point where nothing met the SLO tells nothing about the winner: skipped.
    neither = BreakEvenPoint(20, 1.0, _option(AGGREGATED, 1.0, met=False), _option(SPLIT, 1.0, met=False), "none")
    assert crossovers([_point(10, 1.0, 1.2), neither, _point(40, None, 1.0)]) == pytest.approx((20.0,))
    assert crossovers([neither, _point(40, None, 1.0)]) == ()
    # Split, then one fleet, then split again: two crossovers, each between its own neighbours.
    both = crossovers([_point(500, 1.5, 1.0), _point(1000, 1.0, 1.5), _point(8000, 1.5, 1.0)])
    assert both == pytest.approx((math.sqrt(500 * 1000), math.sqrt(1000 * 8000)))
