"""The capacity planner: search GPU x TP x PP x quantisation x engine knobs x replicas for the
cheapest plan that meets the latency SLO, and say why.

Every configuration is costed with the analytic model (`plan_analytic`), which prunes; the best
few are then replayed through the discrete-event simulator on the workload's arrivals and ranked
by what the simulation measured. Pure apart from CPU time: no I/O, no wall clock; progress is
reported through an optional callback so the CLI can draw a bar.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from hbmserve.capacity.arrivals import Arrivals
from hbmserve.core.config import AutoscalingSpec
from hbmserve.sim.cluster_sim import SimCluster, SLOSpec, simulate
from hbmserve.capacity.engine_core import EngineConfig, EngineConfigError
from hbmserve.capacity.hardware import GpuProfile
from hbmserve.capacity.model_shape import ModelShape
from hbmserve.capacity.perf_model import Deployment, cost_model, memory_fit
from hbmserve.capacity.plan_analytic import EngineKnobs, Workload, capacity_rps, estimate

Progress = Callable[[int, int, str], None]
QUANTS: tuple[str | None, ...] = (None, "fp8", "int8", "int4")


@dataclass(frozen=True)
class SearchSpace:
    tps: tuple[int, ...] = (1, 2, 4, 8)
    pps: tuple[int, ...] = (1, 2)
    quantizations: tuple[str | None, ...] = QUANTS
    max_num_seqs: tuple[int, ...] = (64, 128, 256)
    max_num_batched_tokens: tuple[int, ...] = (2048, 8192)
    chunked_prefill: tuple[bool, ...] = (True, False)
    max_total_gpus: int = 512
    gpu_memory_utilization: float = 0.9


@dataclass(frozen=True)
class PlanCandidate:
    gpu: str
    tp: int
    pp: int
    replicas: int
    warm_replicas: int
    quantization: str  # "bf16" when unquantised
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    usd_per_hour: float
    usd_per_mtok: float | None
    feasible: bool
    reason: str
    source: str = "analytic"  # or "simulated"
    capacity_rps_per_replica: float = 0.0
    max_model_len: int = 0

    def to_json_dict(self) -> dict[str, object]:
        keys = ("gpu", "tp", "pp", "replicas", "warm_replicas", "quantization", "max_num_seqs",
                "max_num_batched_tokens", "chunked_prefill", "ttft_p95_s", "tpot_p95_s", "usd_per_hour",
                "usd_per_mtok", "feasible", "reason", "source", "capacity_rps_per_replica", "max_model_len")
        return {**{k: getattr(self, k) for k in keys},
                "autoscaling": self.autoscaling().model_dump(include=AUTOSCALING_KEYS)}

    def autoscaling(self) -> AutoscalingSpec:
        """The config file's `autoscaling` section this plan implies: the active replicas as
        the floor, the warm ones as headroom, and the capacity the plan was sized with, so the
        policy (autoscale/config.py) scales with the planner's figure, not a typed guess."""
        return AutoscalingSpec(min_replicas=max(1, self.replicas),
                               max_replicas=max(1, self.replicas + self.warm_replicas),
                               **({"replica_capacity_rps": self.capacity_rps_per_replica}
                                  if self.capacity_rps_per_replica > 0 else {}))


AUTOSCALING_KEYS = {"min_replicas", "max_replicas", "replica_capacity_rps"}


@dataclass(frozen=True)
class PlanResult:
    plans: tuple[PlanCandidate, ...]  # ranked: feasible cheapest first
    configs_evaluated: int
    simulated: int
    why: str

    @property
    def feasible(self) -> bool:
        return bool(self.plans) and self.plans[0].feasible


def workload_of(arrivals: Arrivals) -> Workload:
    dur = max(arrivals.duration_s, 1.0)
    rate = len(arrivals) / dur
    if dur >= 120:
        counts = np.bincount((arrivals.t // 60).astype(np.int64))
        peak = float(np.percentile(counts, 99)) / 60.0
    else:  # too short to see minute-scale bursts; assume Poisson noise
        peak = rate + 3 * math.sqrt(rate / 60.0)
    lens = arrivals.prompt + arrivals.output
    return Workload(rate_rps=rate, peak_rps=max(rate, peak), prompt_mean=float(arrivals.prompt.mean()),
                    output_mean=float(arrivals.output.mean()), prompt_p95=float(np.percentile(arrivals.prompt, 95)),
                    max_len=int(lens.max()))


def _max_model_len(model: ModelShape, w: Workload) -> int:
    return int(min(model.max_position_embeddings, 1 << max(9, math.ceil(math.log2(max(2, w.max_len))))))


def _configs(gpus: Sequence[GpuProfile], model: ModelShape, space: SearchSpace):
    for gpu, tp, pp, q, seqs, budget, chunked in itertools.product(
            gpus, space.tps, space.pps, space.quantizations, space.max_num_seqs,
            space.max_num_batched_tokens, space.chunked_prefill):
        if tp > gpu.gpus_per_node or model.num_heads % tp or pp > model.num_layers:
            continue
        yield gpu, tp, pp, q, seqs, budget, chunked


def _evaluate(gpu: GpuProfile, model: ModelShape, tp: int, pp: int, q: str | None, seqs: int, budget: int,
              chunked: bool, w: Workload, slo: SLOSpec, space: SearchSpace, mml: int) -> PlanCandidate:
    dep = Deployment(model, gpu, tp, pp, q, space.gpu_memory_utilization)
    base = dict(gpu=gpu.name, tp=tp, pp=pp, replicas=0, warm_replicas=0, quantization=q or "bf16",
                max_num_seqs=seqs, max_num_batched_tokens=budget, chunked_prefill=chunked, ttft_p95_s=None,
                tpot_p95_s=None, usd_per_hour=0.0, usd_per_mtok=None, feasible=False, max_model_len=mml)
    if q == "fp8" and gpu.fp8_flops is None and gpu.name == "cpu-local":
        return PlanCandidate(**base, reason="fp8 is not supported on the CPU backend")
    fit = memory_fit(dep)
    if not fit.fits:
        return PlanCandidate(**base, reason=fit.reason)
    if fit.kv_tokens < mml:
        return PlanCandidate(**base, reason=f"KV holds {fit.kv_tokens} tokens, below max_model_len {mml}")
    if not chunked and budget < mml:
        return PlanCandidate(**base, reason=f"without chunked prefill the token budget ({budget}) must cover "
                                            f"max_model_len ({mml})")
    cost = cost_model(dep)
    knobs = EngineKnobs(seqs, budget, chunked, fit.kv_tokens)
    cap, light = capacity_rps(cost, knobs, w, slo.ttft_s, slo.tpot_s)
    price_hour = dep.num_gpus * gpu.usd_per_gpu_hour
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
    mtok_hour = w.rate_rps * w.output_mean * 3600 / 1e6
    return PlanCandidate(**{**base, "replicas": r_mean, "warm_replicas": r_peak - r_mean,
                            "ttft_p95_s": at.ttft_p95_s, "tpot_p95_s": at.tpot_p95_s, "usd_per_hour": usd_hour,
                            "usd_per_mtok": usd_hour / mtok_hour if mtok_hour else None, "feasible": True},
                         reason=f"analytic: {cap:.2f} rps per replica within the SLO; {at.reason}",
                         capacity_rps_per_replica=cap)


def _performance_key(c: PlanCandidate, model: ModelShape, gpus: dict[str, GpuProfile]) -> tuple[object, ...]:
    q = None if c.quantization == "bf16" else c.quantization
    g = gpus[c.gpu]
    fmt_flops = g.flops_for(q if q in ("fp8", "int8") else None)
    return (c.gpu, c.tp, c.pp, model.weight_bytes(q), fmt_flops)


def _blocker(ttft: float, tpot: float, slo: SLOSpec) -> str:
    parts = []
    if tpot > slo.tpot_s:
        parts.append(f"TPOT p95 {tpot * 1e3:.1f} ms > {slo.tpot_s * 1e3:.1f} ms")
    if ttft > slo.ttft_s:
        parts.append(f"TTFT p95 {ttft:.3f} s > {slo.ttft_s:.3f} s")
    return "; ".join(parts) or "utilisation cap"


def _rank_by_cost_then_headroom(plans: list[PlanCandidate], slo: SLOSpec) -> list[PlanCandidate]:
    """Cheapest first; plans within 2% of the cheapest of their run count as a tie (price quotes
    are not that precise), and among ties the one with more SLO headroom goes first."""
    by_cost = sorted(plans, key=lambda c: c.usd_per_mtok if c.usd_per_mtok is not None else math.inf)
    out: list[PlanCandidate] = []
    i = 0
    while i < len(by_cost):
        base = by_cost[i].usd_per_mtok
        j = i + 1
        while j < len(by_cost) and base is not None and (by_cost[j].usd_per_mtok or math.inf) <= base * 1.02:
            j += 1
        out += sorted(by_cost[i:j], key=lambda c: _violation(c, slo))
        i = j
    return out


def _violation(c: PlanCandidate, slo: SLOSpec) -> float:
    if c.ttft_p95_s is None or c.tpot_p95_s is None:
        return math.inf
    return max(c.ttft_p95_s / slo.ttft_s, c.tpot_p95_s / slo.tpot_s)


def confirm(c: PlanCandidate, model: ModelShape, gpus: dict[str, GpuProfile], arrivals: Arrivals,
            slo: SLOSpec, space: SearchSpace, extra_replicas: int = 2) -> PlanCandidate:
    """Replay the arrivals through the simulator with the plan's peak replica count (adding up to
    `extra_replicas` if the simulated p95s miss the SLO)."""
    q = None if c.quantization == "bf16" else c.quantization
    dep = Deployment(model, gpus[c.gpu], c.tp, c.pp, q, space.gpu_memory_utilization)
    fit = memory_fit(dep)
    try:
        eng = EngineConfig(num_blocks=fit.kv_tokens // 16, max_num_seqs=c.max_num_seqs,
                           max_num_batched_tokens=c.max_num_batched_tokens, max_model_len=c.max_model_len,
                           enable_chunked_prefill=c.chunked_prefill)
    except EngineConfigError as err:
        return replace(c, feasible=False, reason=f"simulated: {err}", source="simulated")
    total = c.replicas + c.warm_replicas
    for extra in range(extra_replicas + 1):
        n = total + extra
        res = simulate(SimCluster(dep, eng, n, slo), arrivals).summary
        ttft, tpot = res.ttft.p95, res.tpot.p95
        ok = (res.unfinished == 0 and ttft is not None and ttft <= slo.ttft_s
              and (tpot is None or tpot <= slo.tpot_s))
        if ok or extra == extra_replicas:
            usd_hour = n * dep.num_gpus * gpus[c.gpu].usd_per_gpu_hour
            scale = usd_hour / c.usd_per_hour if c.usd_per_hour else 1.0
            blocker = "" if ok else "; misses: " + _blocker(ttft or math.inf, tpot or 0.0, slo)
            return replace(c, replicas=max(1, n - c.warm_replicas), ttft_p95_s=ttft, tpot_p95_s=tpot,
                           usd_per_hour=usd_hour, usd_per_mtok=(c.usd_per_mtok or 0.0) * scale or None,
                           feasible=ok, source="simulated",
                           reason=f"simulated {len(arrivals)} requests on {n} replicas: SLO attainment "
                                  f"{res.slo_attainment:.1%}, {res.preemptions} preemptions{blocker}")
    raise AssertionError("unreachable")


def plan(model: ModelShape, gpus: Sequence[GpuProfile], arrivals: Arrivals, slo: SLOSpec,
         space: SearchSpace = SearchSpace(), confirm_top: int = 5, sim_arrivals: Arrivals | None = None,
         progress: Progress | None = None) -> PlanResult:
    w = workload_of(arrivals)
    mml = _max_model_len(model, w)
    configs = list(_configs(gpus, model, space))
    total = len(configs) + confirm_top
    out: list[PlanCandidate] = []
    for i, (g, tp, pp, q, seqs, budget, chunked) in enumerate(configs):
        out.append(_evaluate(g, model, tp, pp, q, seqs, budget, chunked, w, slo, space, mml))
        if progress and (i % 25 == 0 or i == len(configs) - 1):
            progress(i + 1, total, "analytic")
    feasible = sorted((c for c in out if c.feasible), key=lambda c: (c.usd_per_mtok or math.inf, c.ttft_p95_s or 0))
    by_gpu = {g.name: g for g in gpus}
    confirmed: list[PlanCandidate] = []
    rest: list[PlanCandidate] = []
    seen: set[tuple[object, ...]] = set()
    for c in feasible:
        # One simulation per distinct layout: the cheapest engine knobs of each GPU x TP x PP x
        # weight format (int8 and fp8 behave the same where both run at the same FLOP/s).
        key = _performance_key(c, model, by_gpu)
        if len(confirmed) >= confirm_top or key in seen:
            rest.append(c)
            continue
        seen.add(key)
        confirmed.append(confirm(c, model, by_gpu, sim_arrivals or arrivals, slo, space))
        if progress:
            progress(len(configs) + len(confirmed), total, "simulating")
    good = _rank_by_cost_then_headroom([c for c in confirmed if c.feasible], slo)
    missed = sorted((c for c in confirmed if not c.feasible), key=lambda c: _violation(c, slo))
    infeasible = sorted((c for c in out if not c.feasible), key=lambda c: _violation(c, slo))
    ranked = tuple(good + rest + missed + infeasible)
    if progress:
        progress(total, total, "done")
    why = explain(ranked[0], model, by_gpu, w, slo, space, ranked) if ranked else "no configuration was searched"
    return PlanResult(ranked, len(configs), len(confirmed), why)


def explain(top: PlanCandidate, model: ModelShape, gpus: dict[str, GpuProfile], w: Workload, slo: SLOSpec,
            space: SearchSpace, ranked: Sequence[PlanCandidate]) -> str:
    """One paragraph on why the top plan is the top plan (or what blocks the closest one)."""
    g = gpus[top.gpu]
    q = None if top.quantization == "bf16" else top.quantization
    dep = Deployment(model, g, top.tp, top.pp, q, space.gpu_memory_utilization)
    fit = memory_fit(dep)
    layout = f"{top.gpu} TP{top.tp}" + (f" x PP{top.pp}" if top.pp > 1 else "") + f" {top.quantization}"
    if not top.feasible:
        return (f"No configuration meets TTFT p95 <= {slo.ttft_s:g} s and TPOT p95 <= {slo.tpot_s:g} s. "
                f"The closest is {layout} with {top.replicas} replica(s): {top.reason}. {fit.reason}.")
    cost = cost_model(dep)
    step = float(cost.step_time(1, w.prompt_mean))
    others = [c for c in ranked if c.feasible and c.gpu != top.gpu and c.usd_per_mtok]
    vs = ""
    if others and top.usd_per_mtok:
        o = others[0]
        ratio = o.usd_per_mtok / top.usd_per_mtok
        tie = " (within 2%: this plan has more SLO headroom)" if ratio < 1 else ""
        vs = (f" The best plan on another GPU type ({o.gpu} TP{o.tp} {o.quantization}) costs "
              f"${o.usd_per_mtok:.3f}/Mtok, {ratio:.2f}x this one{tie}.")
    p95 = (f"TTFT p95 {top.ttft_p95_s:.3f} s, TPOT p95 {top.tpot_p95_s * 1e3:.1f} ms"
           if top.ttft_p95_s is not None and top.tpot_p95_s is not None else "")
    warm = (f" and {top.warm_replicas} kept warm for the busiest minute ({w.peak_rps:.1f} rps vs "
            f"{w.rate_rps:.1f} mean)" if top.warm_replicas else "")
    return (f"{layout}: {fit.reason}, so one replica batches up to {top.max_num_seqs} sequences. "
            f"A single-sequence decode step takes {step * 1e3:.1f} ms (reading "
            f"{cost.dense_read_bytes / dep.num_gpus / 1e9:.1f} GB of weights per GPU at "
            f"{g.hbm_bw_bytes_s * g.efficiency.hbm_bw / 1e12:.2f} TB/s effective); batching amortises that read, so "
            f"each replica sustains about {top.capacity_rps_per_replica:.2f} rps within the SLO. "
            f"{top.replicas} active replica(s){warm} give {p95} ({top.source}) at "
            f"${top.usd_per_hour:.2f}/h, ${top.usd_per_mtok or 0:.3f} per million output tokens.{vs}")
