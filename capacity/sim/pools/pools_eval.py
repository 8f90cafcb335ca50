"""Evaluating the two-pool policy (issue 23 req 5) in the simulator, against fixed pool pairs, the
pools scaled apart, and an oracle, as the autoscaler's evaluation does for one fleet
(capacity/sim/evaluate.py).

Every run replays the same trace through disagg_sim with the same pools (a `PoolsCase`: each
pool's deployment and engine, the link, the SLO, the start-up), and differs only in who sets the
replica counts:
  - `one policy`: autoscale/pools/pools_policy.py `decide_pools`, the function the live control
    plane runs for a disaggregated model;
  - `per pool`: each pool alone through the aggregated `decide` (autoscale/policy.py) on its own
    view: prefill on the client's TTFT and its queue, decode on TPOT and its queue. What ran
    before one policy joined them: no prompt-token backlog, no KV need, no TTFT attribution,
    no early decode forecast;
  - `static p+d`: fixed pools; the frontier is, per prefill count, the fewest decode replicas
    reaching the aim, walked as a staircase (more replicas in either pool never hurt);
  - `oracle`: replica schedules planned from the whole trace. Per `bin_s` interval each pool's
    need at a utilisation u of its capacity (prompt tokens/s for prefill, output tokens/s at the
    TPOT-capped batch for decode, a backlog carried as a fluid and drained within the TTFT
    target), made the cheapest schedule by autoscale/oracle.py `cover` (orders one start-up
    ahead), and u bisected to the largest that reaches the aim; then the cheapest of that and
    the static frontier. It is an achievable schedule, not a proven lower bound: `undercuts`
    names any run that reaches the oracle's attainment with fewer GPU-hours.
The aim is the SLO attainment of the largest fixed pools less `attainment_gap`.

Pure apart from CPU time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from hbmserve.autoscale.oracle import OracleConfig, cover
from hbmserve.autoscale.policy import PolicyState, decide
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.pools.pools_policy import PoolsConfig, PoolsSnapshot, PoolsState, decide_pools, pool_config
from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.perf_model import Deployment, cost_model, memory_fit
from hbmserve.capacity.perf.plan_analytic import EngineKnobs, prefill_capacity_rps
from hbmserve.capacity.perf.slo_cap import chunk_step_s
from hbmserve.capacity.sim.pools.disagg_sim import (DisaggCluster, DisaggResult, Pool, PoolScaling, PoolTargets,
                                                    Scaler, simulate_disagg)
from hbmserve.capacity.sim.workload import workload_of
from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.core.config import SloSeconds

PREFILL_BUDGET = 8192  # as the planner's prefill pool (capacity/planning/disagg_plan.py)


@dataclass(frozen=True)
class PoolsCase:
    prefill: Deployment
    decode: Deployment
    prefill_engine: EngineConfig
    decode_engine: EngineConfig
    link: str
    slo: SloSeconds
    startup_s: float = 45.0
    max_prefill: int = 8
    max_decode: int = 8
    usd_per_gpu_hour: float | None = None

    def cluster(self, p: int, d: int) -> DisaggCluster:
        return DisaggCluster(Pool(self.prefill, self.prefill_engine, p), Pool(self.decode, self.decode_engine, d),
                             self.link, self.slo, self.usd_per_gpu_hour)


def pools_case(dep: Deployment, arrivals: Arrivals, slo: SloSeconds, decode_seqs: int, link: str = "infiniband",
               startup_s: float = 45.0, max_prefill: int = 8, max_decode: int = 8) -> PoolsCase:
    """Both pools of `dep` with the planner's engine settings: the prefill pool on an 8,192-token
    budget, the decode pool's batch capped at `decode_seqs` (disagg_plan.decode_seqs_cap)."""
    w = workload_of(arrivals)
    mml = max(2048, 1 << math.ceil(math.log2(w.max_len + 1)))
    blocks = memory_fit(dep).kv_tokens // 16
    return PoolsCase(dep, dep, EngineConfig(num_blocks=blocks, max_num_seqs=256, max_num_batched_tokens=PREFILL_BUDGET,
                                            max_model_len=mml),
                     EngineConfig(num_blocks=blocks, max_num_seqs=decode_seqs,
                                  max_num_batched_tokens=max(decode_seqs, PREFILL_BUDGET), max_model_len=mml),
                     link, slo, startup_s, max_prefill, max_decode)


@dataclass(frozen=True)
class Capacities:
    prefill_tokens_s: float  # prompt tokens one prefill replica computes per second
    prefill_rps: float  # requests/s one prefill replica serves within the TTFT target (queueing included)
    decode_tokens_s: float  # output tokens one decode replica makes per second at its batch cap
    prompt_mean: float
    output_mean: float


def capacities(case: PoolsCase, arrivals: Arrivals) -> Capacities:
    w = workload_of(arrivals)
    seqs = case.decode_engine.max_num_seqs
    step = chunk_step_s(cost_model(case.decode), seqs, seqs, w.prompt_mean + w.output_mean / 2, 0)
    pre, budget = cost_model(case.prefill), case.prefill_engine.max_num_batched_tokens
    knobs = EngineKnobs(case.prefill_engine.max_num_seqs, budget, True, memory_fit(case.prefill).kv_tokens)
    return Capacities(pre.prefill_tokens_per_s(w.prompt_mean, budget), prefill_capacity_rps(pre, knobs, w, case.slo.ttft_s),
                      seqs / step, w.prompt_mean, w.output_mean)


def pools_config(case: PoolsCase, cap: Capacities, base: AutoscaleConfig = AutoscaleConfig()) -> PoolsConfig:
    """The two-pool policy's config for `case`: `base`'s knobs with the case's SLO, start-up and
    bounds, and each pool's capacity in requests/s at the trace's means: the prefill pool's within
    the TTFT target (plan_analytic.prefill_capacity_rps, as live), the decode pool's at its
    TPOT-capped batch."""
    s = case.startup_s
    common = replace(base, ttft_p95_target_s=case.slo.ttft_s, tpot_p95_target_s=case.slo.tpot_s, min_replicas=1,
                     startup_hot_s=min(base.startup_hot_s, s), startup_warm_s=s, startup_cold_s=s)
    return PoolsConfig(
        prefill=pool_config(replace(common, max_replicas=case.max_prefill,
                                    replica_capacity_rps=cap.prefill_rps), decode=False),
        decode=pool_config(replace(common, max_replicas=case.max_decode,
                                   replica_capacity_rps=cap.decode_tokens_s / cap.output_mean), decode=True),
        prefill_tokens_per_s=cap.prefill_tokens_s)


def policy_scaler(config: PoolsConfig) -> Scaler:
    """The live policy in the loop: decide_pools, its state carried between calls."""
    state = PoolsState()

    def step(view: PoolsSnapshot) -> PoolTargets:
        nonlocal state
        decision, state = decide_pools(view, config, state)
        return PoolTargets(decision.prefill.target_active, decision.decode.target_active, decision.reason)
    return step


def per_pool_scaler(config: PoolsConfig) -> Scaler:
    """Each pool alone through the aggregated `decide` (module docstring)."""
    states = [PolicyState(), PolicyState()]

    def step(view: PoolsSnapshot) -> PoolTargets:
        pre, states[0] = decide(view.prefill, config.prefill, states[0])
        dec, states[1] = decide(replace(view.decode, ttft_samples_s=()), config.decode, states[1])
        return PoolTargets(pre.target_active, dec.target_active, f"prefill: {pre.reason} | decode: {dec.reason}")
    return step


def schedule_scaler(prefill: OracleConfig, decode: OracleConfig) -> Scaler:
    return lambda view: PoolTargets(prefill.target_at(view.now), decode.target_at(view.now), "oracle schedule")


@dataclass(frozen=True)
class PoolsRun:
    name: str
    slo_attainment: float
    gpu_hours: float
    usd: float
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    unfinished: int  # requests that never finished (rejected or cut off)
    scale_actions: int
    prefill_replica_h: float
    decode_replica_h: float
    timeline: tuple[tuple[float, int, int], ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def of(cls, name: str, r: DisaggResult) -> PoolsRun:
        s = r.summary
        return cls(name, s.slo_attainment, s.gpu_hours, s.cost_usd, s.ttft.p95, s.tpot.p95, s.requests - s.finished,
                   r.scale_actions, r.prefill_replica_s / 3600, r.decode_replica_s / 3600, r.timeline)


def run(case: PoolsCase, arrivals: Arrivals, name: str, scaler: Scaler | None = None,
        start: tuple[int, int] = (1, 1)) -> PoolsRun:
    scaling = None if scaler is None else PoolScaling(scaler, startup_s=case.startup_s)
    return PoolsRun.of(name, simulate_disagg(case.cluster(*start), arrivals, scaling=scaling))


def static_frontier(case: PoolsCase, arrivals: Arrivals, aim: float) -> list[PoolsRun]:
    """Per prefill count, the fewest decode replicas reaching `aim`, walked as a staircase (more
    replicas in either pool never hurt, so the decode count only falls as prefill grows); every
    run, kept or not, in order."""
    runs: list[PoolsRun] = []
    d = case.max_decode

    def reaches(p: int, n: int) -> bool:
        runs.append(run(case, arrivals, f"static {p}+{n}", start=(p, n)))
        return runs[-1].slo_attainment >= aim

    for p in range(1, case.max_prefill + 1):
        if not reaches(p, d):
            continue  # too few prefill replicas at any decode count tried so far
        while d > 1 and reaches(p, d - 1):
            d -= 1
        if d == 1:
            break  # more prefill replicas only cost more
    return runs


def pool_needs(arrivals: Arrivals, tokens: np.ndarray, per_replica: float, most: int, bin_s: float,
               drain_s: float) -> list[int]:
    """Replicas per interval for a pool whose work is `tokens` per request at `per_replica`
    tokens/s: the interval's tokens, and more while the fluid backlog it leaves would not drain
    within `drain_s` (oracle_search.need_of's rule, in tokens)."""
    n_bins = int(math.floor(float(arrivals.t[-1]) / bin_s)) + 1 if len(arrivals) else 1
    work = np.bincount((arrivals.t // bin_s).astype(np.int64), weights=tokens, minlength=n_bins)[:n_bins]
    need, backlog = [], 0.0
    for w in work:
        n = max(1, min(most, math.ceil(w / (per_replica * bin_s))))
        while n < most and backlog + w - n * per_replica * bin_s > n * per_replica * drain_s:
            n += 1
        backlog = max(0.0, backlog + w - n * per_replica * bin_s)
        need.append(n)
    return need


def needs_at(case: PoolsCase, arrivals: Arrivals, cap: Capacities, u: float,
             bin_s: float) -> tuple[list[int], list[int]]:
    """Each pool's replicas per interval at utilisation `u` of its capacity."""
    return (pool_needs(arrivals, arrivals.prompt.astype(float), u * cap.prefill_tokens_s, case.max_prefill, bin_s,
                       case.slo.ttft_s),
            pool_needs(arrivals, arrivals.output.astype(float), u * cap.decode_tokens_s, case.max_decode, bin_s,
                       case.slo.ttft_s))


def oracle_run(case: PoolsCase, arrivals: Arrivals, cap: Capacities, aim: float, bin_s: float = 30.0,
               bisect_runs: int = 6) -> tuple[PoolsRun | None, list[PoolsRun]]:
    """The cheapest schedule pair found reaching `aim` (None: none did), and every trial."""
    def at(u: float) -> PoolsRun:
        pre, dec = needs_at(case, arrivals, cap, u, bin_s)
        schedules = [OracleConfig(cover(n, bin_s, case.startup_s, initial=n[0])) for n in (pre, dec)]
        return run(case, arrivals, f"oracle u={u:.2f}", schedule_scaler(*schedules), start=(pre[0], dec[0]))

    trials, best, lo, hi = [], None, 0.2, 1.2
    for _ in range(bisect_runs):
        u = (lo + hi) / 2
        r = at(u)
        trials.append(r)
        if r.slo_attainment >= aim:
            best = r if best is None or r.gpu_hours < best.gpu_hours else best
            lo = u
        else:
            hi = u
    return best, trials


@dataclass(frozen=True)
class PoolsEvaluation:
    aim: float
    runs: tuple[PoolsRun, ...]  # one policy, per pool, then the oracle, then the static frontier
    oracle: PoolsRun
    cheapest_static: PoolsRun | None  # the cheapest fixed pools reaching the aim
    capacities: Capacities

    def undercuts(self) -> list[str]:
        """Runs reaching the oracle's attainment with fewer GPU-hours (the oracle is searched,
        not proved: any such run is reported, not hidden)."""
        return [r.name for r in self.runs if r is not self.oracle and r.slo_attainment >= self.oracle.slo_attainment
                and r.gpu_hours < self.oracle.gpu_hours - 1e-9]


def evaluate_pools(case: PoolsCase, arrivals: Arrivals, base: AutoscaleConfig = AutoscaleConfig(),
                   attainment_gap: float = 0.001, policies: Sequence[str] = ("one policy", "per pool"),
                   progress: Callable[[str], None] = lambda _: None) -> PoolsEvaluation:
    cap = capacities(case, arrivals)
    config = pools_config(case, cap, base)
    ceiling = run(case, arrivals, f"static {case.max_prefill}+{case.max_decode}",
                  start=(case.max_prefill, case.max_decode))
    aim = ceiling.slo_attainment - attainment_gap
    progress(f"ceiling {ceiling.name}: {ceiling.slo_attainment:.4f}; aim {aim:.4f}")
    scalers = {"one policy": policy_scaler, "per pool": per_pool_scaler}
    # A live system ran before the trace began: the scaled runs start with the first interval's
    # need at the target utilisation, so none is charged a cold start at t=0.
    pre, dec = needs_at(case, arrivals, cap, base.target_utilization, 60.0)
    runs = []
    for name in policies:
        runs.append(run(case, arrivals, name, scalers[name](config), start=(pre[0], dec[0])))
        progress(f"{name}: {runs[-1].slo_attainment:.4f} at {runs[-1].gpu_hours:.2f} GPU-h")
    frontier = [ceiling, *static_frontier(case, arrivals, aim)]
    met = [r for r in frontier if r.slo_attainment >= aim]
    cheapest = min(met, key=lambda r: r.gpu_hours) if met else None
    progress(f"static frontier: {len(frontier)} runs, cheapest {cheapest.name if cheapest else 'none'}")
    scheduled, trials = oracle_run(case, arrivals, cap, aim)
    oracle = min((r for r in (scheduled, cheapest) if r is not None), key=lambda r: r.gpu_hours, default=ceiling)
    oracle = replace(oracle, name=f"oracle ({oracle.name})")
    progress(f"oracle: {oracle.name} at {oracle.gpu_hours:.2f} GPU-h after {len(trials)} schedule trials")
    return PoolsEvaluation(aim, (*runs, oracle, *frontier), oracle, cheapest, cap)
