"""The static frontier: what a fixed fleet of each size gets on a trace, and which policies it
beats.

    fleets = FleetRuns(cluster, arrivals, config)   # memoised: fleets(n) -> EvalResult
    frontier = static_frontier(fleets)               # fixed-1 .. fixed-max, as a curve
    dominated_by(result, frontier)                   # ["fixed-3", ...]

The baseline every platform engineer can deploy without an autoscaler: n replicas all the time,
for each n from min_replicas (at least 1: a fleet of none serves nothing) to max_replicas. Each
is static-peak's `decide` at that count, replayed like any policy, so a fixed fleet and
static-peak at the same count are the same run. Reported as a curve of (GPU-hours, SLO
attainment).

Dominated: a policy is dominated when some fixed fleet gets at least its SLO attainment for no
more GPU-hours, and is not the very same point (one of the two strictly better), so static-peak
is not dominated by its own fleet.

Cost: one replay per size. The curve stops at the first size whose least possible bill (its
replicas held from t=0 to the last arrival) is no less than the GPU-hours of a smaller fleet
that met the SLO for every request: it would cost as much or more for at most the same 100 %,
so it dominates nothing the smaller one does not (and undercuts no oracle it does not). On the
Azure trace the frontier took 8 s of a 2-minute `--policy all` (docs/benchmarks.md, issue 27),
so the sizes are not capped; a trace no fleet serves in full replays every size.
The oracle's search (capacity/sim/oracle_search.py) draws on the same memo, so no fleet is replayed twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hbmserve.autoscale.baselines import StaticPeakConfig
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.registry import POLICIES
from hbmserve.capacity.sim.evaluate import EvalCluster, EvalResult, run_policy
from hbmserve.capacity.traces.arrivals import Arrivals

FLEET_PREFIX = "fixed-"


def fleet_label(n: int) -> str:
    return f"{FLEET_PREFIX}{n}"


class FleetRuns:
    """Fixed-fleet replays of one trace on one cluster, each run once (`fleets(n)`)."""

    def __init__(self, cluster: EvalCluster, arr: Arrivals, config: AutoscaleConfig) -> None:
        self.cluster, self.arr, self.config = cluster, arr, config
        self.runs: dict[int, EvalResult] = {}

    @property
    def sizes(self) -> range:
        return range(max(1, self.config.min_replicas), self.config.max_replicas + 1)

    def least_gpu_hours(self, n: int) -> float:
        """The least a fleet of n can be billed: n replicas from t=0 to the last arrival (the
        simulator bills every replica until it is removed or the run ends)."""
        last = float(self.arr.t[-1]) if len(self.arr) else 0.0
        return n * self.cluster.scenario.deployment.num_gpus * last / 3600.0

    def __call__(self, n: int) -> EvalResult:
        if n not in self.runs:
            self.runs[n] = run_policy(fleet_label(n), POLICIES["static-peak"],
                                      StaticPeakConfig(n), self.cluster, self.arr, self.config)
        return self.runs[n]


def static_frontier(fleets: FleetRuns) -> list[EvalResult]:
    """Every fixed fleet from the smallest size up, cut where no larger one can matter (module
    docstring, "Cost")."""
    out: list[EvalResult] = []
    full = None  # GPU-hours of the cheapest fleet so far that met the SLO for every request
    for n in fleets.sizes:
        if full is not None and fleets.least_gpu_hours(n) >= full:
            break
        r = fleets(n)
        out.append(r)
        if r.summary.slo_attainment >= 1.0:
            full = r.summary.gpu_hours if full is None else min(full, r.summary.gpu_hours)
    return out


def dominates(a: EvalResult, b: EvalResult) -> bool:
    """`a` gets at least `b`'s SLO attainment for no more GPU-hours, and is a different point."""
    sa, sb = a.summary, b.summary
    return (sa.slo_attainment >= sb.slo_attainment and sa.gpu_hours <= sb.gpu_hours
            and (sa.slo_attainment > sb.slo_attainment or sa.gpu_hours < sb.gpu_hours))


def dominated_by(result: EvalResult, frontier: Iterable[EvalResult]) -> list[str]:
    """The fixed fleets that dominate `result` (none, for a point on or above the frontier)."""
    return [f.policy for f in frontier if dominates(f, result)]


def frontier_rows(frontier: Sequence[EvalResult]) -> list[dict[str, float | int | str]]:
    """The curve for a report: one row per fleet size."""
    return [{"policy": r.policy, "replicas": int(r.policy.removeprefix(FLEET_PREFIX)),
             "gpu_hours": r.summary.gpu_hours, "slo_attainment": r.summary.slo_attainment,
             "ttft_p95_s": r.summary.ttft.p95, "tpot_p95_s": r.summary.tpot.p95}
            for r in frontier]
