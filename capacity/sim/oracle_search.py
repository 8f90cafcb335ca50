"""Planning the oracle (autoscale/oracle.py) from the whole trace, with the simulator.

    plan_oracle(cluster, arrivals, config) -> OraclePlan

1. Ceiling. The trace on max_replicas, all serving from t=0: the best SLO attainment this
   cluster reaches on it, and which requests it serves in time (the others - prompts too long
   for the TTFT target, say - no schedule saves). The oracle aims at the ceiling's attainment
   less `attainment_gap` (0.1 point): the service the cluster can give, at the least cost.
2. Need per interval, at a utilisation u of the capacity model's requests/s per replica (the
   `replica_capacity_rps` every policy is told): each `bin_s` interval's arrivals over
   u x capacity, rounded up, and more while the backlog it leaves (fluid: arrivals beyond
   capacity carried over) would not drain within the TTFT target.
3. Cheapest schedule for that need: `cover` (exact, autoscale/oracle.py): each replica ordered
   exactly one cold start-up before its interval, held through gaps no longer than a start-up.
4. Search. Each schedule is replayed in the simulator, as every policy is. u is bracketed
   from 1 and bisected to the largest u whose schedule reaches the aim. Then the cheapest
   schedule that fell short is tried with the kept schedule's replicas restored only at and
   next to the intervals where it lost requests the ceiling served ("avoidable misses"),
   widening that set by what it loses next. The cheapest schedule that reaches the aim is the
   oracle; if none does, max_replicas throughout (the ceiling, which does by definition).
5. Fixed fleets. A fleet of n replicas all the time is a schedule too, and on traces of lulls
   and bursts it can beat every schedule the need search finds (issue 27: a fleet of 3 reached
   100% at 12.0 GPU-h where the search stopped at 13.9). Every fleet whose least possible bill
   (n replicas to the last arrival) is below the kept schedule's GPU-hours is replayed, and
   the cheapest that reaches the aim is kept if it is cheaper. The replays are the static
   frontier's (capacity/sim/frontier.py `FleetRuns`), so `--policy all` runs each fleet once.

In what sense this is the limit. Two parts are exact: billing charges every replica-second the
same whether a replica starts, waits or serves, so knowing the future, standbys buy nothing and
a cold start ordered exactly one start-up ahead is the earliest useful order and the cheapest;
and for a given need per interval, `cover` is the cheapest schedule (proved level by level in
autoscale/oracle.py, checked against brute force in the tests). The need itself is searched, at
a resolution of `bin_s` and one replica, within `max_runs` replays: what is found is an
achievable schedule, so the true minimum at the aim is at most the oracle's GPU-hours, and no
evaluated policy may reach the oracle's attainment with fewer (`undercut_oracle`, checked on
every evaluated trace by the tests and the benchmark). By step 5, no fixed fleet does, on any
trace: each fleet either was replayed and lost, or costs at least the oracle by its least bill.
Other policies are checked, not searched: `assert_oracle_is_the_limit` raises `OracleUndercut`
naming each run that reaches the oracle's attainment with fewer GPU-hours, and `hbmserve
autoscale evaluate` exits 1 on it. It is not proved that no schedule could do better.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from hbmserve.autoscale.oracle import OracleConfig, cover
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.registry import POLICIES, PolicyEntry
from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.capacity.sim.evaluate import EvalCluster, EvalResult, run_policy
from hbmserve.capacity.sim.frontier import FleetRuns


STEP = 0.8  # the utilisation search's bracketing step


@dataclass(frozen=True)
class OracleSpec:
    bin_s: float = 30.0
    attainment_gap: float = 0.001  # the aim: the ceiling's attainment less this
    max_runs: int = 8  # simulator replays in the search, the ceiling not included
    bisect_runs: int = 6  # of which for the utilisation search


@dataclass(frozen=True)
class OraclePlan:
    result: EvalResult  # the kept schedule's replay
    config: OracleConfig
    ceiling: EvalResult
    aim: float  # SLO attainment aimed at
    trials: tuple[tuple[float, float], ...]  # (SLO attainment, GPU-hours) of each replay


def need_of(arr: Arrivals, config: AutoscaleConfig, bin_s: float,
            utilization: float) -> np.ndarray:
    """Replicas per interval at `utilization` of the model's capacity, and more while the
    backlog an interval leaves (its arrivals beyond that capacity, carried over as a fluid)
    would not drain within the TTFT target."""
    n_bins = int(math.floor(float(arr.t[-1]) / bin_s)) + 1 if len(arr) else 1
    counts = np.bincount((arr.t // bin_s).astype(np.int64), minlength=n_bins)[:n_bins]
    per_replica = config.replica_capacity_rps * utilization
    lo, hi = max(config.min_replicas, 1), config.max_replicas
    need = np.empty(n_bins, dtype=np.int64)
    backlog = 0.0
    for k, c in enumerate(counts):
        n = max(lo, min(hi, math.ceil(c / (per_replica * bin_s))))
        while n < hi and backlog + c - n * per_replica * bin_s > \
                n * per_replica * config.ttft_p95_target_s:
            n += 1
        backlog = max(0.0, backlog + c - n * per_replica * bin_s)
        need[k] = n
    return need


def plan_oracle(cluster: EvalCluster, arr: Arrivals, config: AutoscaleConfig,
                label: str = "oracle", entry: PolicyEntry | None = None,
                spec: OracleSpec = OracleSpec(), fleets: FleetRuns | None = None) -> OraclePlan:
    """`fleets`: the fixed-fleet replays to draw on (and add to); None: a memo of its own."""
    entry = entry or POLICIES["oracle"]
    fleets = fleets or FleetRuns(cluster, arr, config)
    ceiling = fleets(config.max_replicas)
    aim = ceiling.summary.slo_attainment - spec.attainment_gap
    bin_s, start_s = spec.bin_s, config.startup_cold_s
    first_min = math.ceil(len(arr.window(0.0, 60.0)) / 60.0
                          / (config.replica_capacity_rps * config.target_utilization))
    bins = (arr.t // bin_s).astype(np.int64)

    def run(need: np.ndarray) -> tuple[OracleConfig, EvalResult]:
        early = need[: max(1, math.ceil(start_s / bin_s))].max()
        initial = max(config.min_replicas, min(config.max_replicas, max(first_min, int(early))))
        schedule = cover(need.tolist(), bin_s, start_s, initial=initial,
                         tick_s=cluster.decision_interval_s, after=config.min_replicas)
        oc = OracleConfig(schedule, note=f"{bin_s:g}s intervals")
        return oc, run_policy(label, entry, oc, cluster, arr, config)

    trials: list[tuple[float, float]] = []
    seen: dict[bytes, tuple[OracleConfig, EvalResult, np.ndarray]] = {}

    def replay(need: np.ndarray) -> tuple[OracleConfig, EvalResult, np.ndarray]:
        """The schedule's run, and the intervals at or next to its avoidable misses."""
        key = need.tobytes()
        if key not in seen:
            oc, res = run(need)
            trials.append((res.summary.slo_attainment, res.summary.gpu_hours))
            n = len(need)
            hit = np.bincount(bins[ceiling.met_slo & ~res.met_slo], minlength=n)[:n] > 0
            seen[key] = (oc, res, hit | np.r_[hit[1:], False] | np.r_[False, hit[:-1]])
        return seen[key]

    # The ceiling is itself a schedule that reaches the aim: max_replicas throughout.
    n_bins = len(need_of(arr, config, bin_s, 1.0))
    best = (np.full(n_bins, config.max_replicas), OracleConfig(((0.0, config.max_replicas),),
                                                                note="max_replicas"),
            dataclasses.replace(ceiling, policy=label))
    bad = None  # (need, intervals near its misses) of the latest schedule that fell short
    # Utilisation of the model's capacity: bracket from 1 by steps of STEP, then bisect.
    u_ok, u_bad, u = None, None, 1.0
    for _ in range(64):  # steps that land on a schedule already run cost nothing
        if len(trials) >= spec.bisect_runs:
            break
        need = need_of(arr, config, bin_s, u)
        oc, res, near = replay(need)
        if res.summary.slo_attainment >= aim:
            if res.summary.gpu_hours <= best[2].summary.gpu_hours:
                best = (need, oc, res)
            u_ok = u if u_ok is None else max(u_ok, u)
        else:
            bad, u_bad = (need, near), u if u_bad is None else min(u_bad, u)
        if u_ok is None:
            u *= STEP
        elif u_bad is None:
            u /= STEP
        elif u_bad / u_ok < 1.02:
            break
        else:
            u = math.sqrt(u_ok * u_bad)
    # Refine: the schedule that fell short, with the kept schedule's replicas put back only
    # around the intervals where it lost requests; what else it then loses widens that set.
    while bad is not None and len(trials) < spec.max_runs:
        need = np.where(bad[1], best[0], bad[0])
        if (need == best[0]).all():
            break
        oc, res, near = replay(need)
        if res.summary.slo_attainment >= aim:
            if res.summary.gpu_hours <= best[2].summary.gpu_hours:
                best = (need, oc, res)
            break
        if not (near & ~bad[1]).any():
            break
        bad = (bad[0], bad[1] | near)
    # Every fixed fleet is a schedule too (step 5).
    tried = []
    for n in fleets.sizes:
        if fleets.least_gpu_hours(n) >= best[2].summary.gpu_hours:
            break
        res = fleets(n)
        tried.append(n)
        if res.summary.slo_attainment >= aim and res.summary.gpu_hours < best[2].summary.gpu_hours:
            best = (np.full(n_bins, n), OracleConfig(((0.0, n),), note=f"a fixed fleet of {n}"),
                    dataclasses.replace(res, policy=label))
    detail = {"oracle": {
        "aim_slo_attainment": aim, "ceiling_slo_attainment": ceiling.summary.slo_attainment,
        "ceiling_gpu_hours": ceiling.summary.gpu_hours, "interval_s": bin_s,
        "schedule_steps": len(best[1].schedule), "schedule": best[1].note,
        "fixed_fleets_tried": tried,
        "trials": [{"slo_attainment": a, "gpu_hours": g} for a, g in trials]}}
    result = dataclasses.replace(best[2], detail=detail)
    return OraclePlan(result, best[1], ceiling, aim, tuple(trials))


def undercut_oracle(results: Iterable[EvalResult], oracle: EvalResult) -> list[str]:
    """Policies that reach the oracle's SLO attainment with fewer GPU-hours: none, if the
    oracle is the limit it claims to be."""
    o = oracle.summary
    return [r.policy for r in results if r is not oracle
            and r.summary.slo_attainment >= o.slo_attainment and r.summary.gpu_hours < o.gpu_hours]


class OracleUndercut(RuntimeError):
    """A run reached the oracle's SLO attainment with fewer GPU-hours: the oracle's search
    fell short of the limit it claims to be."""


def assert_oracle_is_the_limit(results: Iterable[EvalResult], oracle: EvalResult) -> None:
    """Raise OracleUndercut naming every run in `results` (policies, fixed fleets) that
    undercuts `oracle`."""
    results = list(results)
    names = set(undercut_oracle(results, oracle))
    if not names:
        return
    o = oracle.summary
    found = "; ".join(f"{r.policy} {r.summary.slo_attainment:.2%} at {r.summary.gpu_hours:.2f} "
                      "GPU-h" for r in results if r.policy in names)
    raise OracleUndercut(f"the oracle ({o.slo_attainment:.2%} at {o.gpu_hours:.2f} GPU-h) is not "
                         f"the limit on this trace: {found} reach its SLO attainment with fewer "
                         "GPU-hours")
