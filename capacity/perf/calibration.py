"""Fitting a hardware profile's efficiency factors and overheads to measured latencies.

The measurements are closed-loop benchmark points (vLLM's serving benchmark with
`--max-concurrency N`): N clients, each sending its next request when the previous one ends, with
fixed prompt and output lengths. `closed_loop` replays exactly that through the same
`EngineCore` the simulator uses; `fit_profile` searches (Nelder-Mead in log space) the profile's
per-step, per-sequence and per-request overheads and its FLOP/s and bandwidth efficiencies to
minimise the mean absolute log error of TTFT and TPOT p50/p95, and reports MAPE before and after.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hbmserve.capacity.perf.engine_core import EngineConfig, EngineCore, SimRequest
from hbmserve.capacity.perf.hardware import GpuProfile
from hbmserve.capacity.perf.model_shape import ModelShape
from hbmserve.capacity.perf.perf_model import Deployment, cost_model

METRICS = ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s")
# (name, getter, setter bounds) of the parameters the fit moves.
PARAMS = ("step_s", "per_seq_s", "request_s", "eff_flops", "eff_bw")


@dataclass(frozen=True)
class MeasuredPoint:
    concurrency: int
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p95_s: float | None = None

    def measured(self) -> dict[str, float]:
        return {m: getattr(self, m) for m in METRICS if getattr(self, m) is not None}


@dataclass(frozen=True)
class FitResult:
    profile: GpuProfile
    mape_before_pct: float
    mape_after_pct: float
    rows: tuple[dict[str, float | int | str], ...]  # per point and metric: measured, before, after
    evaluations: int


def closed_loop(dep: Deployment, cfg: EngineConfig, concurrency: int, num_requests: int,
                prompt: int, output: int) -> dict[str, float]:
    """TTFT and TPOT percentiles of a closed-loop run (the request overhead is part of TTFT)."""
    core = EngineCore(cfg, cost_model(dep))
    overhead = dep.gpu.overheads.request_s
    entries: list[tuple[float, int, SimRequest]] = []
    sent = 0
    for _ in range(min(concurrency, num_requests)):
        heapq.heappush(entries, (overhead, sent, SimRequest(sent, 0.0, prompt, output)))
        sent += 1
    done: list[SimRequest] = []
    now = 0.0
    plan, plan_start = None, 0.0
    while len(done) < num_requests:
        t_entry = entries[0][0] if entries else math.inf
        t_plan = plan_start + plan.total_s if plan else math.inf
        if t_entry == math.inf and t_plan == math.inf:
            plan = core.plan()
            plan_start = now
            if plan is None:
                break
            continue
        if t_entry <= t_plan:
            now, _, req = heapq.heappop(entries)
            if not core.add(req):
                raise ValueError(f"prompt {prompt} + output {output} exceeds max_model_len {cfg.max_model_len}")
            if plan is not None and plan.steps > 1:
                need = plan.steps_done_by(now - plan_start)
                plan.durations, plan.cumulative = plan.durations[:need], plan.cumulative[:need]
            elif plan is None:
                plan, plan_start = core.plan(), now
            continue
        now = t_plan
        finished = core.commit(plan, plan.steps, now)
        for r in finished:
            done.append(r)
            if sent < num_requests:
                heapq.heappush(entries, (now + overhead, sent, SimRequest(sent, now, prompt, output)))
                sent += 1
        plan, plan_start = core.plan(), now
    ttft = np.array([r.first_token_t - r.arrival for r in done])
    tpot = np.array([(r.finish_t - r.first_token_t) / (r.max_tokens - 1) for r in done if r.max_tokens > 1])
    out = {"ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p95_s": float(np.percentile(ttft, 95))}
    if tpot.size:
        out |= {"tpot_p50_s": float(np.percentile(tpot, 50)), "tpot_p95_s": float(np.percentile(tpot, 95))}
    return out


def with_params(p: GpuProfile, x: Sequence[float]) -> GpuProfile:
    step, per_seq, req, ef, eb = (math.exp(v) for v in x)
    return p.with_overheads(step, per_seq, req).with_efficiency(min(ef, 1.0), min(eb, 1.0))


def params_of(p: GpuProfile) -> list[float]:
    o, e = p.overheads, p.efficiency
    return [math.log(max(v, 1e-7)) for v in (o.step_s, o.per_seq_s, o.request_s, e.flops, e.hbm_bw)]


def predict(profile: GpuProfile, model: ModelShape, cfg: EngineConfig, points: Sequence[MeasuredPoint],
            tp: int = 1) -> list[dict[str, float]]:
    dep = Deployment(model, profile, tp=tp)
    return [closed_loop(dep, cfg, pt.concurrency, pt.num_requests, pt.prompt_tokens, pt.output_tokens)
            for pt in points]


def mape_pct(points: Sequence[MeasuredPoint], preds: Sequence[dict[str, float]]) -> float:
    errs = [abs(pr[m] - v) / v for pt, pr in zip(points, preds, strict=True)
            for m, v in pt.measured().items() if m in pr and v > 0]
    return 100.0 * float(np.mean(errs)) if errs else math.nan


def _loss(points: Sequence[MeasuredPoint], preds: Sequence[dict[str, float]]) -> float:
    errs = [abs(math.log(max(pr[m], 1e-9) / v)) for pt, pr in zip(points, preds, strict=True)
            for m, v in pt.measured().items() if m in pr and v > 0]
    return float(np.mean(errs)) if errs else 0.0


def _towards(centroid: list[float], worst: list[float], c: float) -> list[float]:
    return [m + c * (w - m) for m, w in zip(centroid, worst, strict=True)]


def nelder_mead(f: Callable[[list[float]], float], x0: Sequence[float], step: float = 0.7,
                max_evals: int = 300, tol: float = 1e-4) -> tuple[list[float], float, int]:
    """A plain Nelder-Mead minimiser (no scipy on the target machines)."""
    n = len(x0)
    simplex = [list(x0)] + [[x0[j] + (step if j == i else 0.0) for j in range(n)] for i in range(n)]
    vals = [f(x) for x in simplex]
    evals = n + 1
    while evals < max_evals:
        order = sorted(range(n + 1), key=vals.__getitem__)
        simplex, vals = [simplex[i] for i in order], [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < tol:
            break
        centroid = [sum(x[j] for x in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        xr = _towards(centroid, worst, -1.0)
        fr = f(xr)
        evals += 1
        if fr < vals[0]:
            xe = _towards(centroid, worst, -2.0)
            fe = f(xe)
            evals += 1
            simplex[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = xr, fr
        else:
            xc = _towards(centroid, worst, 0.5)
            fc = f(xc)
            evals += 1
            if fc < vals[-1]:
                simplex[-1], vals[-1] = xc, fc
            else:
                best = simplex[0]
                simplex = [best] + [[best[j] + 0.5 * (x[j] - best[j]) for j in range(n)] for x in simplex[1:]]
                vals = [vals[0]] + [f(x) for x in simplex[1:]]
                evals += n
    i = min(range(n + 1), key=vals.__getitem__)
    return simplex[i], vals[i], evals


def fit_profile(profile: GpuProfile, model: ModelShape, cfg: EngineConfig, points: Sequence[MeasuredPoint],
                max_evals: int = 300, tp: int = 1) -> FitResult:
    if not points:
        raise ValueError("no measured points to fit")
    before = predict(profile, model, cfg, points, tp)

    def loss(x: list[float]) -> float:
        return _loss(points, predict(with_params(profile, x), model, cfg, points, tp))

    x, _, evals = nelder_mead(loss, params_of(profile), max_evals=max_evals)
    fitted = with_params(profile, x)
    after = predict(fitted, model, cfg, points, tp)
    rows = tuple({"concurrency": pt.concurrency, "metric": m, "measured": v, "before": b[m], "after": a[m]}
                 for pt, b, a in zip(points, before, after, strict=True) for m, v in pt.measured().items() if m in a)
    return FitResult(fitted, mape_pct(points, before), mape_pct(points, after), rows, evals)
