"""Aggregated or split (issue 23): does one fleet that mixes prefill chunks into its decode steps,
or a prefill pool and a decode pool with each prompt's KV sent between them, serve a trace for
fewer dollars within the SLO, and why.

The trade-off. On one fleet every decode step may carry a prefill chunk, and every sequence in it
waits for the whole step: long prompts slow the decodes beside them, so a strict TPOT caps the
chunk (slo_cap.py `batch_cap`, as `hbmserve plan` does) or the fleet grows until few steps carry
one. Split, a decode step carries no chunk and TPOT is the decode batch's alone; but each pool is
sized for its own job in whole replicas, neither lends the other its idle time, and the KV crosses
a link (perf_model.kv_transfer_s). Which wins depends on the prompts, the TPOT and the load.

Searched side by side on the trace, every layout in the simulator:
  - aggregated, per TP: the TPOT cap's engine knobs, and each of `budgets` with vLLM's
    max_num_seqs; the fewest replicas meeting the SLO (doubling, then bisection);
  - disaggregated, per (prefill TP, decode TP): the cheapest (prefill, decode) replica counts. More
    replicas in either pool never hurt, so the counts meeting the SLO form a staircase, walked from
    one prefill replica and the most decode replicas that fit in at most P + D runs. The decode
    pool's max_num_seqs is the most a decode-only step carries within the TPOT target; the link is
    NVLink where both pools fit in one node's GPUs, else InfiniBand (every pair taken across
    nodes: conservative), or the one asked for.
The SLO is the planner's (confirm.meets: TTFT and TPOT p95 under target, every request done).
A layout's dollars are its GPUs' hours over the trace's span, as the planner prices a fleet by the
hour (not the simulated run, whose drain after the last arrival is longer for slower layouts), per
million tokens of the trace, input and output. Layouts meeting the SLO rank by that; within 2% of
each other aggregated first (one pool, no KV link to run), then the fewest GPUs, then the most
requests within the SLO. Pure apart from CPU time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import product

from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.perf_model import KV_LINKS, Deployment, StepCostModel, cost_model, memory_fit
from hbmserve.capacity.perf.plan_analytic import Workload
from hbmserve.capacity.perf.slo_cap import MAX_SEQS, batch_cap, chunk_step_s
from hbmserve.capacity.planning.confirm import meets
from hbmserve.capacity.planning.planner import max_model_len_for
from hbmserve.capacity.sim.cluster_sim import SimCluster, simulate
from hbmserve.capacity.sim.pools.disagg_sim import DisaggCluster, Pool, simulate_disagg
from hbmserve.capacity.sim.workload import workload_of
from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.core.config import SloSeconds

AGGREGATED, SPLIT = "aggregated", "disaggregated"
LINKS = ("auto", *KV_LINKS)
DEFAULT_BUDGETS = (512, 2048)  # uncapped chunked-prefill budgets tried beside the TPOT cap's
VLLM_MAX_SEQS = 256  # vLLM's default max_num_seqs, with the uncapped budgets
PREFILL_BUDGET = 8192  # the prefill pool's steps carry no decode: no TPOT caps their budget
DEFAULT_MAX_GPUS = 16  # two 8-GPU nodes
TIE = 1.02  # within 2% of the cheapest: aggregated, then the fewest GPUs, go first


@dataclass(frozen=True)
class ServingOption:
    kind: str  # AGGREGATED or SPLIT
    tp: int  # aggregated: every replica's; split: the prefill pool's
    decode_tp: int  # aggregated: = tp
    replicas: int  # aggregated: the fleet; split: the prefill pool (the largest tried when none meets)
    decode_replicas: int  # aggregated: 0
    max_num_seqs: int  # aggregated: per replica; split: per decode replica (the TPOT cap)
    max_num_batched_tokens: int  # aggregated: the chunked-prefill budget; split: the prefill pool's
    link: str | None  # split: the KV's path, one of perf_model.KV_LINKS
    gpus: int
    meets_slo: bool
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    slo_attainment: float  # requests meeting both targets, of all
    goodput_rps: float
    usd: float  # the fleet's GPU-hours over the trace's span, priced
    usd_per_mtok: float | None  # per million tokens of the trace, input and output together
    kv_transfer_s: float = 0.0  # split: mean per request
    prefill_busy: float | None = None  # split: the share of each pool's replica time spent in steps
    decode_busy: float | None = None
    capped: bool = False  # aggregated: the TPOT cap's knobs (slo_cap.batch_cap), as `hbmserve plan` runs
    note: str = ""  # why the setting was not simulated (it cannot meet the TPOT at any size)

    @property
    def layout(self) -> str:
        if self.note:  # not simulated: no size to name
            return f"aggregated TP{self.tp} (the TPOT cap)" if self.kind == AGGREGATED else \
                f"split prefill TP{self.tp} : decode TP{self.decode_tp}"
        if self.kind == AGGREGATED:
            cap = ", the TPOT cap" if self.capped else ""
            return (f"aggregated {self.replicas} x TP{self.tp} (budget {self.max_num_batched_tokens:,} tokens, "
                    f"{self.max_num_seqs} seqs{cap})")
        return (f"split {self.replicas} prefill x TP{self.tp} : {self.decode_replicas} decode x TP{self.decode_tp}"
                f" (decode batch <= {self.max_num_seqs}), KV over {self.link}")


@dataclass(frozen=True)
class DisaggPlan:
    options: tuple[ServingOption, ...]  # each layout's cheapest meeting the SLO (or closest), ranked
    best: ServingOption
    reason: str
    tried: tuple[ServingOption, ...]  # every simulation run, in order

    def best_of(self, kind: str) -> ServingOption | None:
        return next((o for o in self.options if o.kind == kind), None)


def pool_tps(dep: Deployment, max_model_len: int) -> tuple[int, ...]:
    """The TPs searched: the deployment's, and twice it within a node (else half of it) where the
    weights and one max_model_len request fit."""
    def fits(tp: int) -> bool:
        d = replace(dep, tp=tp)
        fit = memory_fit(d)
        return fit.fits and fit.kv_tokens >= max_model_len and dep.model.num_heads % tp == 0

    other = 2 * dep.tp if 2 * dep.tp <= dep.gpu.gpus_per_node and fits(2 * dep.tp) else \
        dep.tp // 2 if dep.tp > 1 and fits(dep.tp // 2) else None
    return (dep.tp,) if other is None else (dep.tp, other)


def decode_seqs_cap(cost: StepCostModel, tpot_s: float, w: Workload, kv_tokens: int) -> int:
    """The most sequences a decode-only step carries within `tpot_s` at the workload's mean
    context, and that the KV cache holds; 0 when one alone misses."""
    ctx = w.prompt_mean + w.output_mean / 2
    most = int(min(MAX_SEQS, kv_tokens // max(1.0, ctx)))

    def fits(seqs: int) -> bool:
        return chunk_step_s(cost, seqs, seqs, ctx, 0) <= tpot_s

    if most < 1 or not fits(1):
        return 0
    if fits(most):
        return most
    lo, hi = 1, most
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def plan_disagg(dep: Deployment, arrivals: Arrivals, slo: SloSeconds, max_gpus: int = DEFAULT_MAX_GPUS,
                link: str = "auto", tps: Sequence[int] | None = None, budgets: Sequence[int] = DEFAULT_BUDGETS,
                usd_per_gpu_hour: float | None = None) -> DisaggPlan:
    """Aggregated and split layouts of `dep`'s model on its GPU, each sized to the fewest GPUs
    (at most `max_gpus`) meeting `slo` on `arrivals`, ranked; the pick and why."""
    if not len(arrivals):
        raise ValueError("the trace has no requests")
    w = workload_of(arrivals)
    mml = max_model_len_for(dep.model, w)
    tps = tuple(dict.fromkeys(tps)) if tps else pool_tps(dep, mml)
    _check(dep, tps, mml, max_gpus, link)
    price = dep.gpu.usd_per_gpu_hour if usd_per_gpu_hour is None else usd_per_gpu_hour
    sim = _Sim(arrivals, slo, price, mml)
    options = [*_aggregated(sim, dep, tps, w, budgets, max_gpus), *_split(sim, dep, tps, w, link, max_gpus)]
    ranked = rank(options)
    return DisaggPlan(ranked, ranked[0], explain(ranked, sim.tried, slo, max_gpus), tuple(sim.tried))


def _check(dep: Deployment, tps: Sequence[int], mml: int, max_gpus: int, link: str) -> None:
    """ValueError naming what cannot be searched: the link, PP, a TP, or a GPU budget below one replica."""
    if link not in LINKS:
        raise ValueError(f"link must be one of {', '.join(LINKS)}, not {link!r}")
    if dep.pp != 1:
        raise ValueError(f"PP{dep.pp}: only tensor parallelism is searched; give a PP1 deployment")
    for tp in tps:
        if dep.model.num_heads % tp or tp > dep.gpu.gpus_per_node:
            raise ValueError(f"TP{tp}: " + (f"{dep.model.num_heads} attention heads do not split over {tp} GPUs"
                                            if dep.model.num_heads % tp else
                                            f"a {dep.gpu.name} node holds {dep.gpu.gpus_per_node} GPUs"))
        fit = memory_fit(replace(dep, tp=tp))
        if not fit.fits or fit.kv_tokens < mml:
            raise ValueError(f"TP{tp}: " + (fit.reason if not fit.fits else
                                              f"KV holds {fit.kv_tokens} tokens, below max_model_len {mml}"))
    if max_gpus < min(tps):
        raise ValueError(f"max GPUs {max_gpus} is below one replica's {min(tps)}")


def _aggregated(sim: _Sim, dep: Deployment, tps: Sequence[int], w: Workload, budgets: Sequence[int],
                max_gpus: int) -> list[ServingOption]:
    """Per TP and engine setting, the fewest replicas meeting the SLO (or why the setting cannot)."""
    out = []
    for tp in tps:
        d = replace(dep, tp=tp)
        for seqs, budget, capped, note in _aggregated_settings(d, sim.slo, w, budgets):
            if note:
                out.append(_unrun(AGGREGATED, tp, tp, seqs, budget, note, capped))
                continue
            fewest = _fewest(lambda n, s=seqs, b=budget, c=capped: sim.aggregated(d, s, b, n, c),
                             _least(d, (w.prompt_mean + w.output_mean) * w.rate_rps), max_gpus // tp)
            out += [fewest] if fewest else []
    return out


def _split(sim: _Sim, dep: Deployment, tps: Sequence[int], w: Workload, link: str,
           max_gpus: int) -> list[ServingOption]:
    """Per (prefill TP, decode TP), the cheapest pools meeting the SLO (or why none can)."""
    out = []
    for tp_p, tp_d in product(tps, tps):
        pd, dd = replace(dep, tp=tp_p), replace(dep, tp=tp_d)
        seqs = decode_seqs_cap(cost_model(dd), sim.slo.tpot_s, w, memory_fit(dd).kv_tokens)
        if not seqs:
            out.append(_unrun(SPLIT, tp_p, tp_d, 0, PREFILL_BUDGET, f"a decode step of one sequence on TP{tp_d} "
                              f"takes longer than TPOT {sim.slo.tpot_s * 1e3:g} ms"))
            continue

        def run(p: int, n: int, pd=pd, dd=dd, seqs=seqs) -> ServingOption:
            one_node = p * pd.tp + n * dd.tp <= dep.gpu.gpus_per_node
            return sim.split(pd, dd, seqs, p, n, link if link != "auto" else "nvlink" if one_node else "infiniband")

        cheapest = _staircase(run, tp_p, tp_d, max_gpus, _least(pd, w.prompt_mean * w.rate_rps))
        out += [cheapest] if cheapest else []
    return out


class _Sim:
    """Runs one layout at one size on the trace and keeps every run (the reason compares layouts
    at equal GPU counts)."""

    def __init__(self, arrivals: Arrivals, slo: SloSeconds, price: float, mml: int) -> None:
        self.arrivals, self.slo, self.price, self.mml = arrivals, slo, price, mml
        self.tokens = int(arrivals.prompt.sum() + arrivals.output.sum())
        self.hours = max(arrivals.duration_s, 1e-9) / 3600
        self.tried: list[ServingOption] = []

    def engine(self, dep: Deployment, seqs: int, budget: int) -> EngineConfig:
        return EngineConfig(num_blocks=memory_fit(dep).kv_tokens // 16, max_num_seqs=seqs,
                            max_num_batched_tokens=budget, max_model_len=self.mml)

    def aggregated(self, dep: Deployment, seqs: int, budget: int, n: int, capped: bool) -> ServingOption:
        s = simulate(SimCluster(dep, self.engine(dep, seqs, budget), n, self.slo, self.price), self.arrivals).summary
        return self._keep(s, kind=AGGREGATED, tp=dep.tp, decode_tp=dep.tp, replicas=n, decode_replicas=0,
                          max_num_seqs=seqs, max_num_batched_tokens=budget, link=None, gpus=n * dep.tp, capped=capped)

    def split(self, pd: Deployment, dd: Deployment, seqs: int, p: int, n: int, link: str) -> ServingOption:
        spec = DisaggCluster(Pool(pd, self.engine(pd, VLLM_MAX_SEQS, PREFILL_BUDGET), p),
                             Pool(dd, self.engine(dd, seqs, max(seqs, PREFILL_BUDGET)), n), link, self.slo, self.price)
        r = simulate_disagg(spec, self.arrivals)
        return self._keep(r.summary, kind=SPLIT, tp=pd.tp, decode_tp=dd.tp, replicas=p, decode_replicas=n,
                          max_num_seqs=seqs, max_num_batched_tokens=PREFILL_BUDGET, link=link, gpus=spec.gpus,
                          kv_transfer_s=r.transfer_s, prefill_busy=r.prefill_busy, decode_busy=r.decode_busy)

    def _keep(self, s, **layout) -> ServingOption:
        usd = layout["gpus"] * self.price * self.hours
        o = ServingOption(**layout, meets_slo=meets(s, self.slo), ttft_p95_s=s.ttft.p95, tpot_p95_s=s.tpot.p95,
                          slo_attainment=s.slo_attainment, goodput_rps=s.goodput_rps, usd=usd,
                          usd_per_mtok=usd / self.tokens * 1e6 if self.tokens else None)
        self.tried.append(o)
        return o


def _aggregated_settings(dep: Deployment, slo: SloSeconds, w: Workload,
                         budgets: Sequence[int]) -> list[tuple[int, int, bool, str]]:
    """(max_num_seqs, max_num_batched_tokens, is the TPOT cap, why it cannot run) per setting."""
    cap = batch_cap(cost_model(dep), slo.tpot_s, w, memory_fit(dep).kv_tokens)
    first = (cap.max_num_seqs, cap.max_num_batched_tokens, True, "" if cap.feasible else cap.reason)
    return [first, *((VLLM_MAX_SEQS, b, False, "") for b in dict.fromkeys(budgets)
                     if (VLLM_MAX_SEQS, b) != first[:2])]


def _unrun(kind: str, tp: int, decode_tp: int, seqs: int, budget: int, note: str,
           capped: bool = False) -> ServingOption:
    return ServingOption(kind, tp, decode_tp, 0, 0, seqs, budget, None, 0, False, None, None, 0.0, 0.0, 0.0, None,
                         capped=capped, note=note)


def _fewest(run: Callable[[int], ServingOption], least: int, most: int) -> ServingOption | None:
    """The fewest replicas (least..most) meeting the SLO: doubling from `least`, then bisecting;
    the largest tried when none does."""
    if most < 1:
        return None
    lo, n = least - 1, min(least, most)  # lo: the most replicas known to miss
    while True:
        last = run(n)
        if last.meets_slo or n == most:
            break
        lo, n = n, min(most, n * 2)
    if not last.meets_slo:
        return last
    best = last
    while best.replicas - lo > 1:
        o = run((lo + best.replicas) // 2)
        best, lo = (o, lo) if o.meets_slo else (best, o.replicas)
    return best


def _staircase(run: Callable[[int, int], ServingOption], tp_p: int, tp_d: int, max_gpus: int,
               least: int) -> ServingOption | None:
    """The cheapest (prefill, decode) meeting the SLO within `max_gpus`, from `least` prefill
    replicas up; the closest miss (most attainment) when none does. Per prefill count the fewest
    decode replicas by bisection; each next count only with fewer decode replicas (more would cost
    more), and only while it could still be cheaper (module docstring: the staircase)."""
    def most_decode(p: int) -> int:
        return (max_gpus - p * tp_p) // tp_d

    p = max(1, least)
    d = most_decode(p)
    best: ServingOption | None = None
    missed: list[ServingOption] = []
    while d >= 1 and (best is None or p * tp_p + tp_d < best.gpus):
        top = run(p, d)
        if not top.meets_slo:
            missed.append(top)
            p, d = p + 1, min(d, most_decode(p + 1))
            continue
        lo = 0  # the most decode replicas known to miss with p prefill
        while top.decode_replicas - lo > 1:
            o = run(p, (lo + top.decode_replicas) // 2)
            top, lo = (o, lo) if o.meets_slo else (top, o.decode_replicas)
        best = top if best is None or (top.gpus, -top.slo_attainment) < (best.gpus, -best.slo_attainment) else best
        p, d = p + 1, min(top.decode_replicas - 1, most_decode(p + 1))
    if best is not None:
        return best
    return max(missed, key=lambda o: (o.slo_attainment, -o.gpus), default=None)


def _least(dep: Deployment, tokens_per_s: float) -> int:
    """Replicas no fewer than which can carry `tokens_per_s`: each at most its roofline."""
    return max(1, math.ceil(tokens_per_s / cost_model(dep).roofline_tokens_per_s()))


def _usd(o: ServingOption) -> float:
    return math.inf if o.usd_per_mtok is None else o.usd_per_mtok


def rank(options: Sequence[ServingOption]) -> tuple[ServingOption, ...]:
    """Meeting the SLO first, cheapest first; within TIE of the cheapest of a run, aggregated, then
    the fewest GPUs, then the most requests within the SLO first. Then the misses, most attainment
    first; the unrun last."""
    meeting = sorted((o for o in options if o.meets_slo), key=_usd)
    out: list[ServingOption] = []
    i = 0
    while i < len(meeting):
        j = i + 1
        while j < len(meeting) and _usd(meeting[j]) <= _usd(meeting[i]) * TIE:
            j += 1
        out += sorted(meeting[i:j], key=lambda o: (o.kind != AGGREGATED, o.gpus, -o.slo_attainment, _usd(o)))
        i = j
    missed = sorted((o for o in options if not o.meets_slo), key=lambda o: (bool(o.note), -o.slo_attainment, o.gpus))
    return (*out, *missed)


def _miss(o: ServingOption, slo: SloSeconds) -> str:
    if o.note:
        return o.note
    parts = [f"TTFT p95 {o.ttft_p95_s:.2f} s > {slo.ttft_s:g} s" if o.ttft_p95_s and o.ttft_p95_s > slo.ttft_s else "",
             f"TPOT p95 {o.tpot_p95_s * 1e3:.1f} ms > {slo.tpot_s * 1e3:g} ms"
             if o.tpot_p95_s and o.tpot_p95_s > slo.tpot_s else ""]
    return "; ".join(p for p in parts if p) + f" ({o.slo_attainment:.1%} of requests within the SLO)"


def _cost(o: ServingOption) -> str:
    return f"{o.gpus} GPUs at ${_usd(o):.3f}/Mtok"


def _closest_at(tried: Sequence[ServingOption], kind: str, gpus: int) -> ServingOption | None:
    """Of the runs of `kind` on as many GPUs as `gpus` or fewer, the one closest to the SLO."""
    same = [o for o in tried if o.kind == kind and o.gpus <= gpus]
    return max(same, key=lambda o: (o.meets_slo, o.slo_attainment, o.gpus), default=None)


def explain(ranked: Sequence[ServingOption], tried: Sequence[ServingOption], slo: SloSeconds, max_gpus: int) -> str:
    """Why the first layout is first: its figures, the other kind's cheapest, and what the other
    kind gets on the winner's GPUs."""
    best = ranked[0]
    if not best.meets_slo:
        return (f"no layout meets TTFT p95 <= {slo.ttft_s:g} s and TPOT p95 <= {slo.tpot_s * 1e3:g} ms within "
                f"{max_gpus} GPUs; the closest is {best.layout}: {_miss(best, slo)}")
    won = (f"{best.layout} meets the SLO on {_cost(best)} (TTFT p95 {best.ttft_p95_s:.2f} s, TPOT p95 "
           f"{best.tpot_p95_s * 1e3:.1f} ms)")
    kind = SPLIT if best.kind == AGGREGATED else AGGREGATED
    other = next((o for o in ranked if o.kind == kind), None)
    if best.kind == SPLIT:
        won += (f": its decode steps carry no prefill chunk; each prompt's KV crosses {best.link} in "
                f"{best.kv_transfer_s * 1e3:.1f} ms")
    if other is None:
        return f"{won}; no {kind} layout fits in {max_gpus} GPUs"
    if not other.meets_slo:
        vs = f"no {kind} layout meets it within {max_gpus} GPUs: the closest, {other.layout}, gets {_miss(other, slo)}"
    else:
        ratio = _usd(other) / _usd(best)
        tie = " (within 2%: the simpler layout goes first, one pool and no KV link)" if ratio <= TIE else ""
        vs = f"the cheapest {kind} layout, {other.layout}, needs {_cost(other)} ({ratio:.2f}x){tie}"
        if other.kind == SPLIT:
            vs += (f"; its prefill pool is busy {other.prefill_busy:.0%} of the time and its decode pool "
                   f"{other.decode_busy:.0%}: each pool is sized in whole replicas for its own job")
    same = _closest_at(tried, kind, best.gpus)
    if other.meets_slo and same is not None and not same.meets_slo:
        vs += f"; on {same.gpus} GPUs the closest {kind} layout, {same.layout}, gets {_miss(same, slo)}"
    return f"{won}. {vs[0].upper()}{vs[1:]}"
