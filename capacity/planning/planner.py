"""The capacity planner: search GPU x TP x PP x weight format x engine knobs x replicas for the
cheapest plan that meets the latency SLO, and say why.

The engine knobs come from the TPOT SLO (capacity/perf/slo_cap.py): a decode step that carries a full
prefill chunk must fit the TPOT target, so per layout the token budget and batch grids are cut
where that stops holding and the limit itself is searched too. Weight formats default to those
without a known quality loss (bf16, fp8); int8 and int4 are searched when asked for and carry
their trade-off in `quality_note`.

Every configuration is costed with the analytic model (`plan_analytic`); those are candidates.
The cheapest few distinct layouts are then confirmed in the discrete-event simulator
(confirm.py: one replica's capacity, then the smallest fleet on the trace), and only
confirmed plans rank as feasible; each carries the analytic model's error against the
simulator. Pure apart from CPU time: no I/O, no wall clock; progress is reported through an
optional callback so the CLI can draw a bar.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import replace


from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.capacity.perf.engine_core import EngineConfig, EngineConfigError
from hbmserve.capacity.perf.hardware import GpuProfile
from hbmserve.capacity.perf.model_shape import QUALITY_TRADEOFFS, ModelShape, weight_format
from hbmserve.capacity.perf.perf_model import Deployment, StepCostModel, cost_model, memory_fit
from hbmserve.capacity.perf.plan_analytic import EngineKnobs, Workload, capacity_rps, estimate
from hbmserve.capacity.perf.scenario import Scenario
from hbmserve.capacity.perf.slo_cap import batch_cap, chunk_step_s, knob_grid
from hbmserve.capacity.perf.token_cost import token_costs
from hbmserve.core.config import SloSeconds
from hbmserve.capacity.sim.workload import workload_of
from hbmserve.capacity.planning.confirm import simulated_capacity_rps, smallest_fleet
from hbmserve.capacity.planning.plan_types import (AUTOSCALING_KEYS, CANDIDATE, CONFIRMED, INFEASIBLE, MISSED, PlanCandidate,
                                     PlanResult, SearchSpace)

__all__ = ["AUTOSCALING_KEYS", "PlanCandidate", "PlanResult", "SearchSpace", "confirm", "plan", "workload_of"]


Progress = Callable[[int, int, str], None]


def max_model_len_for(model: ModelShape, w: Workload) -> int:
    """The smallest power of two (>= 512) that holds the workload's longest request, within the model's."""
    return int(min(model.max_position_embeddings, 1 << max(9, math.ceil(math.log2(max(2, w.max_len))))))


def _layouts(gpus: Sequence[GpuProfile], model: ModelShape, space: SearchSpace):
    for gpu, tp, pp, q in itertools.product(gpus, space.tps, space.pps, space.quantizations):
        if tp > gpu.gpus_per_node or model.num_heads % tp or pp > model.num_layers:
            continue
        yield gpu, tp, pp, q


def _quant(c: PlanCandidate) -> str | None:
    return None if c.quantization == "bf16" else c.quantization


def _candidates(gpu: GpuProfile, model: ModelShape, tp: int, pp: int, q: str | None, w: Workload,
                slo: SloSeconds, space: SearchSpace, mml: int) -> list[PlanCandidate]:
    """Every knob combination of one layout, costed analytically (or the one reason none runs)."""
    dep = Deployment(model, gpu, tp, pp, q, space.gpu_memory_utilization)
    fmt = weight_format(q, model.dtype_bytes)
    base = dict(gpu=gpu.name, tp=tp, pp=pp, replicas=0, warm_replicas=0, quantization=q or "bf16",
                max_num_seqs=0, max_num_batched_tokens=0, chunked_prefill=True, ttft_p95_s=None,
                tpot_p95_s=None, usd_per_hour=0.0, status=INFEASIBLE, max_model_len=mml,
                quality_note=QUALITY_TRADEOFFS.get(fmt))
    if q == "fp8" and gpu.fp8_flops is None and gpu.name == "cpu-local":
        return [PlanCandidate(**base, reason="fp8 is not supported on the CPU backend")]
    fit = memory_fit(dep)
    if not fit.fits:
        return [PlanCandidate(**base, reason=fit.reason)]
    if fit.kv_tokens < mml:
        return [PlanCandidate(**base, reason=f"KV holds {fit.kv_tokens} tokens, below max_model_len {mml}")]
    cost = cost_model(dep)
    out: list[PlanCandidate] = []
    for chunked in space.chunked_prefill:
        if chunked:
            pairs = knob_grid(cost, slo.tpot_s, w, fit.kv_tokens, space.max_num_seqs, space.max_num_batched_tokens)
            why = "" if pairs else batch_cap(cost, slo.tpot_s, w, fit.kv_tokens).reason
        else:
            # Without chunking a step prefills whole prompts up to the budget (>= max_model_len)
            # while every decode waits: that whole step must fit the TPOT target, so the smallest
            # budget that admits max_model_len is the only one worth searching.
            budget = min((b for b in space.max_num_batched_tokens if b >= mml), default=mml)
            stall = chunk_step_s(cost, budget, 0, w.prompt_mean, budget)
            pairs = tuple((s, budget) for s in space.max_num_seqs) if stall <= slo.tpot_s else ()
            why = (f"without chunked prefill a prefill step of {budget:,} tokens stalls every decode for "
                   f"{stall:.2f} s > TPOT {slo.tpot_s:g} s")
        if not pairs:
            out.append(PlanCandidate(**{**base, "chunked_prefill": chunked}, reason=why))
        for seqs, budget in pairs:
            out.append(_analytic(cost, EngineKnobs(seqs, budget, chunked, fit.kv_tokens), w, slo, space,
                                 {**base, "max_num_seqs": seqs, "max_num_batched_tokens": budget,
                                  "chunked_prefill": chunked}))
    return out


def _analytic(cost: StepCostModel, knobs: EngineKnobs, w: Workload, slo: SloSeconds, space: SearchSpace,
              base: dict) -> PlanCandidate:
    dep = cost.dep
    cap, light = capacity_rps(cost, knobs, w, slo.ttft_s, slo.tpot_s)
    price_hour = dep.num_gpus * dep.gpu.usd_per_gpu_hour
    if cap <= 0:
        blocker = _blocker(light.ttft_p95_s, light.tpot_p95_s, slo)
        return PlanCandidate(**{**base, "ttft_p95_s": light.ttft_p95_s, "tpot_p95_s": light.tpot_p95_s,
                                "replicas": 1, "usd_per_hour": price_hour},
                             reason=f"misses the SLO even at light load: {blocker}")
    r_mean = max(1, math.ceil(w.rate_rps / cap))
    r_peak = max(r_mean, math.ceil(w.peak_rps / cap))
    if r_peak * dep.num_gpus > space.max_total_gpus:
        return PlanCandidate(**{**base, "replicas": r_peak, "usd_per_hour": r_peak * price_hour},
                             reason=f"needs {r_peak * dep.num_gpus} GPUs, above the limit {space.max_total_gpus}")
    at = estimate(cost, knobs, w, w.peak_rps / r_peak)
    usd_hour = r_peak * price_hour
    return PlanCandidate(**{**base, "replicas": r_mean, "warm_replicas": r_peak - r_mean, "status": CANDIDATE,
                            "ttft_p95_s": at.ttft_p95_s, "tpot_p95_s": at.tpot_p95_s, "usd_per_hour": usd_hour},
                         costs=_costs(cost, knobs, w, r_peak, usd_hour), analytic_usd_per_hour=usd_hour,
                         reason=f"analytic candidate (not simulated): {cap:.2f} rps per replica within the SLO; "
                                f"{at.reason}", capacity_rps_per_replica=cap)


def _costs(cost: StepCostModel, knobs: EngineKnobs, w: Workload, replicas: int, usd_hour: float):
    """Token costs at the mean load per replica (the decode batch sets an output token's share)."""
    batch = estimate(cost, knobs, w, w.rate_rps / max(1, replicas)).batch
    return token_costs(cost, knobs.max_num_batched_tokens, batch, w, usd_hour)


def _performance_key(c: PlanCandidate, model: ModelShape, gpus: dict[str, GpuProfile]) -> tuple[object, ...]:
    q = _quant(c)
    fmt_flops = gpus[c.gpu].flops_for(q if q in ("fp8", "int8") else None)
    return (c.gpu, c.tp, c.pp, model.weight_bytes(q), fmt_flops)


def _blocker(ttft: float, tpot: float, slo: SloSeconds) -> str:
    parts = []
    if tpot > slo.tpot_s:
        parts.append(f"TPOT p95 {tpot * 1e3:.1f} ms > {slo.tpot_s * 1e3:.1f} ms")
    if ttft > slo.ttft_s:
        parts.append(f"TTFT p95 {ttft:.3f} s > {slo.ttft_s:.3f} s")
    return "; ".join(parts) or "utilisation cap"


def _rank_by_cost_then_headroom(plans: list[PlanCandidate], slo: SloSeconds) -> list[PlanCandidate]:
    """Cheapest first; plans within 2% of the cheapest of their run count as a tie (price quotes
    are not that precise), and among ties the one with more SLO headroom goes first."""
    by_cost = sorted(plans, key=lambda c: c.usd_per_hour)
    out: list[PlanCandidate] = []
    i = 0
    while i < len(by_cost):
        j = i + 1
        while j < len(by_cost) and by_cost[j].usd_per_hour <= by_cost[i].usd_per_hour * 1.02:
            j += 1
        out += sorted(by_cost[i:j], key=lambda c: _violation(c, slo))
        i = j
    return out


def _violation(c: PlanCandidate, slo: SloSeconds) -> float:
    if c.ttft_p95_s is None or c.tpot_p95_s is None:
        return math.inf
    return max(c.ttft_p95_s / slo.ttft_s, c.tpot_p95_s / slo.tpot_s)


def scenario_of(c: PlanCandidate, model: ModelShape, gpus: dict[str, GpuProfile], slo: SloSeconds,
                space: SearchSpace) -> Scenario:
    """The plan as the simulator runs it, with its whole fleet (EngineConfigError: it cannot run)."""
    dep = Deployment(model, gpus[c.gpu], c.tp, c.pp, _quant(c), space.gpu_memory_utilization)
    eng = EngineConfig(num_blocks=memory_fit(dep).kv_tokens // 16, max_num_seqs=c.max_num_seqs,
                       max_num_batched_tokens=c.max_num_batched_tokens, max_model_len=c.max_model_len,
                       enable_chunked_prefill=c.chunked_prefill)
    return Scenario(dep, eng, c.replicas + c.warm_replicas, gpus[c.gpu].usd_per_gpu_hour, slo.ttft_s, slo.tpot_s)


def confirm(c: PlanCandidate, model: ModelShape, gpus: dict[str, GpuProfile], arrivals: Arrivals,
            slo: SloSeconds, space: SearchSpace, lengths: Arrivals | None = None) -> PlanCandidate:
    """Measure one replica's capacity in the simulator (requests with the lengths of `lengths`,
    default `arrivals`), then find the smallest fleet that meets the SLO on `arrivals`."""
    try:
        sc = scenario_of(c, model, gpus, slo, space)
    except EngineConfigError as err:
        return replace(c, status=MISSED, reason=f"simulated: {err}", source="simulated")
    dep, eng = sc.deployment, sc.engine
    fit = memory_fit(dep)
    cost, w = cost_model(dep), workload_of(arrivals)
    knobs = EngineKnobs(c.max_num_seqs, c.max_num_batched_tokens, c.chunked_prefill, fit.kv_tokens)
    analytic, _ = capacity_rps(cost, knobs, workload_of(lengths or arrivals), slo.ttft_s, slo.tpot_s,
                               utilisation_cap=1.0)
    measured = simulated_capacity_rps(dep, eng, slo, lengths or arrivals, analytic or c.capacity_rps_per_replica)
    guess = math.ceil(w.peak_rps / measured) if measured > 0 else c.replicas + c.warm_replicas
    fleet = smallest_fleet(dep, eng, slo, arrivals, guess)
    s, n = fleet.summary, fleet.replicas
    usd_hour = n * dep.num_gpus * gpus[c.gpu].usd_per_gpu_hour
    active = min(n, max(1, math.ceil(w.rate_rps / measured))) if measured > 0 else n
    misses = "" if fleet.ok else "; misses: " + _blocker(s.ttft.p95 or math.inf, s.tpot.p95 or 0.0, slo)
    error = f"{analytic / measured - 1:+.0%}" if measured > 0 else "n/a"
    return replace(c, replicas=active, warm_replicas=n - active, ttft_p95_s=s.ttft.p95, tpot_p95_s=s.tpot.p95,
                   usd_per_hour=usd_hour, costs=_costs(cost, knobs, w, n, usd_hour),
                   status=CONFIRMED if fleet.ok else MISSED, source="simulated",
                   capacity_rps_per_replica=measured, analytic_capacity_rps=analytic,
                   simulated_capacity_rps=measured,
                   reason=f"simulated {len(arrivals)} requests on {n} replicas: SLO attainment "
                          f"{s.slo_attainment:.1%}, {s.preemptions} preemptions; one replica carries "
                          f"{measured:.2f} rps within the SLO (analytic {analytic:.2f}, error {error}){misses}")


def plan(model: ModelShape, gpus: Sequence[GpuProfile], arrivals: Arrivals, slo: SloSeconds,
         space: SearchSpace = SearchSpace(), confirm_top: int = 5, sim_arrivals: Arrivals | None = None,
         progress: Progress | None = None) -> PlanResult:
    w = workload_of(arrivals)
    mml = max_model_len_for(model, w)
    layouts = list(_layouts(gpus, model, space))
    total = len(layouts) + confirm_top
    out: list[PlanCandidate] = []
    for i, (g, tp, pp, q) in enumerate(layouts):
        out += _candidates(g, model, tp, pp, q, w, slo, space, mml)
        if progress and (i % 5 == 0 or i == len(layouts) - 1):
            progress(i + 1, total, "analytic")
    candidates = sorted((c for c in out if c.status == CANDIDATE), key=lambda c: (c.usd_per_hour, c.ttft_p95_s or 0))
    by_gpu = {g.name: g for g in gpus}
    confirmed: list[PlanCandidate] = []
    rest: list[PlanCandidate] = []
    seen: set[tuple[object, ...]] = set()
    for c in candidates:
        # One simulation per distinct layout: the cheapest engine knobs of each GPU x TP x PP x
        # weight format (int8 and fp8 behave the same where both run at the same FLOP/s).
        key = _performance_key(c, model, by_gpu)
        if len(confirmed) >= confirm_top or key in seen:
            rest.append(c)
            continue
        seen.add(key)
        confirmed.append(confirm(c, model, by_gpu, sim_arrivals or arrivals, slo, space, lengths=arrivals))
        if progress:
            progress(len(layouts) + len(confirmed), total, "simulating")
    good = _rank_by_cost_then_headroom([c for c in confirmed if c.feasible], slo)
    missed = sorted((c for c in confirmed if not c.feasible), key=lambda c: _violation(c, slo))
    infeasible = sorted((c for c in out if c.status == INFEASIBLE), key=lambda c: _violation(c, slo))
    ranked = tuple(good + rest + missed + infeasible)
    if progress:
        progress(total, total, "done")
    why = explain(ranked[0], model, by_gpu, w, slo, space, ranked) if ranked else "no configuration was searched"
    return PlanResult(ranked, len(out), len(confirmed), why)


def explain(top: PlanCandidate, model: ModelShape, gpus: dict[str, GpuProfile], w: Workload, slo: SloSeconds,
            space: SearchSpace, ranked: Sequence[PlanCandidate]) -> str:
    """One paragraph on why the top plan is the top plan (or what blocks the closest one)."""
    g = gpus[top.gpu]
    dep = Deployment(model, g, top.tp, top.pp, _quant(top), space.gpu_memory_utilization)
    fit = memory_fit(dep)
    if top.status == CANDIDATE:
        return (f"No plan is confirmed: none was simulated and met TTFT p95 <= {slo.ttft_s:g} s and TPOT p95 <= "
                f"{slo.tpot_s:g} s. The cheapest analytic candidate is {top.layout} with {top.replicas} "
                f"replica(s) (+{top.warm_replicas} warm) at ${top.usd_per_hour:.2f}/h: {top.reason}. Simulate it "
                f"(raise --confirm-top) before buying.")
    if not top.feasible:
        head = f"No configuration meets TTFT p95 <= {slo.ttft_s:g} s and TPOT p95 <= {slo.tpot_s:g} s."
        return f"{head} The closest is {top.layout} with {top.replicas} replica(s): {top.reason}. {fit.reason}."
    cost = cost_model(dep)
    step = float(cost.step_time(1, w.prompt_mean))
    full = chunk_step_s(cost, top.max_num_batched_tokens, top.max_num_seqs, w.prompt_mean + w.output_mean / 2,
                        w.prompt_mean)
    others = [c for c in ranked if c.feasible and c.gpu != top.gpu]
    vs = ""
    if others:
        o = others[0]
        ratio = o.usd_per_hour / top.usd_per_hour
        tie = " (within 2%: this plan has more SLO headroom)" if ratio < 1 else ""
        vs = f" The best confirmed plan on another GPU type ({o.layout}) costs {ratio:.2f}x this one{tie}."
    p95 = (f"TTFT p95 {top.ttft_p95_s:.3f} s, TPOT p95 {top.tpot_p95_s * 1e3:.1f} ms"
           if top.ttft_p95_s is not None and top.tpot_p95_s is not None else "")
    warm = (f" and {top.warm_replicas} kept warm for the busiest minute ({w.peak_rps:.1f} rps vs "
            f"{w.rate_rps:.1f} mean)" if top.warm_replicas else "")
    c = top.costs
    price = (f"${c.usd_per_mtok_input:.3f} per million input tokens, ${c.usd_per_mtok_output:.3f} per million "
             f"output, ${c.usd_per_mtok_blended:.3f} blended, ${c.usd_per_1k_requests:.3f} per 1,000 requests"
             if c else "")
    quality = f" Quality: {top.quality_note}." if top.quality_note else ""
    return (f"{top.layout}: {fit.reason}. The TPOT SLO caps the batch at {top.max_num_seqs} sequences and "
            f"{top.max_num_batched_tokens:,} tokens: a decode step carrying a full chunk takes {full * 1e3:.0f} ms "
            f"(one sequence alone: {step * 1e3:.1f} ms). Each replica carries {top.capacity_rps_per_replica:.2f} rps "
            f"within the SLO in the simulator (the analytic model said {top.analytic_capacity_rps or 0:.2f}). "
            f"{top.replicas} active replica(s){warm} give {p95} (simulated) at ${top.usd_per_hour:.2f}/h: "
            f"{price}.{quality}{vs}")
