"""Confirming an analytic plan in the simulator, and measuring how wrong the analytic model was.

Two measurements per plan:
  - one replica's capacity: the highest Poisson rate at which one replica, fed requests with
    the workload's own (prompt, output) lengths, meets both p95 SLOs in the simulator. It is
    the figure the analytic model's `capacity_rps` (without its utilisation cap) estimates, so
    their ratio is the analytic model's error, and it is the `replica_capacity_rps` the plan
    hands the autoscaling policy (which adds its own utilisation target);
  - the fleet: the fewest replicas that meet the SLO on the trace itself (its own burstiness),
    searched from the count the measured capacity implies for the busiest minute.
Pure apart from CPU time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.perf_model import Deployment
from hbmserve.capacity.sim.cluster_sim import SimCluster, simulate
from hbmserve.core.config import SloSeconds
from hbmserve.capacity.sim.metrics import SimSummary

CAPACITY_REQUESTS = 1000  # requests per probe: enough for a steady p95, cheap enough to bisect
CAPACITY_PRECISION = 1.02  # stop bisecting when hi / lo is below this
MAX_FLEET_STEPS = 3  # replicas tried above (or below) the first guess


def meets(s: SimSummary, slo: SloSeconds) -> bool:
    return (s.unfinished == 0 and s.ttft.p95 is not None and s.ttft.p95 <= slo.ttft_s
            and (s.tpot.p95 is None or s.tpot.p95 <= slo.tpot_s))


def simulated_capacity_rps(dep: Deployment, eng: EngineConfig, slo: SloSeconds, lengths: Arrivals,
                           guess_rps: float, seed: int = 0, n: int = CAPACITY_REQUESTS) -> float:
    """Highest Poisson rate one replica carries within the SLO (0 if none), lengths drawn from
    `lengths`. The same unit-rate arrivals are stretched for every probe (common random
    numbers), so the verdict moves with the rate alone and the bisection is stable."""
    rng = np.random.default_rng(seed)
    unit = np.cumsum(rng.exponential(1.0, n))
    pick = rng.integers(0, len(lengths), n)
    prompt, output = lengths.prompt[pick], lengths.output[pick]
    cluster = SimCluster(dep, eng, 1, slo)

    def ok(rate: float) -> bool:
        return meets(simulate(cluster, Arrivals(unit / rate, prompt, output)).summary, slo)

    lo = hi = max(guess_rps, 1e-3)
    if ok(lo):
        for _ in range(12):
            hi *= 1.25
            if not ok(hi):
                break
            lo = hi
        else:
            return lo
    else:
        for _ in range(12):
            lo /= 1.25
            if ok(lo):
                break
            hi = lo
        else:
            return 0.0
    while hi / lo > CAPACITY_PRECISION:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


@dataclass(frozen=True)
class FleetRun:
    replicas: int
    summary: SimSummary
    ok: bool


def smallest_fleet(dep: Deployment, eng: EngineConfig, slo: SloSeconds, arrivals: Arrivals,
                   first_guess: int, steps: int = MAX_FLEET_STEPS, most: int | None = None) -> FleetRun:
    """The fewest replicas (within `steps` of `first_guess`, and at most `most`) that meet the SLO
    on the trace; the largest tried, marked not ok, when none does."""
    def run(n: int) -> FleetRun:
        s = simulate(SimCluster(dep, eng, n, slo), arrivals).summary
        return FleetRun(n, s, meets(s, slo))

    best = run(max(1, first_guess))
    if best.ok:
        for _ in range(steps):
            if best.replicas == 1:
                break
            fewer = run(best.replicas - 1)
            if not fewer.ok:
                break
            best = fewer
        return best
    for _ in range(steps):
        if most is not None and best.replicas >= most:
            break
        best = run(best.replicas + 1)
        if best.ok:
            break
    return best
