"""Policies side by side on one trace, as `hbmserve autoscale evaluate --policy all` runs them:

    c = compare(names, cluster, arrivals, config)   # each policy, then the static frontier
    c.dominated_by(result)                          # the fixed fleets that beat it
    c.check()                                       # raises OracleUndercut if the oracle is beaten

The fixed-fleet replays are shared (capacity/sim/frontier.py FleetRuns): the oracle's search replays
the fleets that could be cheaper than its schedule, and the frontier reuses them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.registry import POLICIES
from hbmserve.capacity.sim.evaluate import EvalCluster, EvalResult, evaluate
from hbmserve.capacity.sim.frontier import FleetRuns, dominated_by, static_frontier
from hbmserve.capacity.traces.arrivals import Arrivals


@dataclass(frozen=True)
class Comparison:
    results: tuple[EvalResult, ...]  # one per policy, in the order asked
    frontier: tuple[EvalResult, ...] = ()  # fixed-1 .. (empty: not run)
    wall_s: dict[str, float] = field(default_factory=dict)  # per policy, and "static frontier"

    @property
    def oracle(self) -> EvalResult | None:
        return next((r for r in self.results if POLICIES[r.policy].clairvoyant), None)

    def dominated_by(self, result: EvalResult) -> list[str]:
        return dominated_by(result, self.frontier)

    def check(self) -> None:
        """With the oracle run: raise OracleUndercut if any policy or fixed fleet reaches its
        SLO attainment with fewer GPU-hours."""
        from hbmserve.capacity.sim.oracle_search import assert_oracle_is_the_limit

        if self.oracle is not None:
            assert_oracle_is_the_limit([*self.results, *self.frontier], self.oracle)


def compare(names: Sequence[str], cluster: EvalCluster, arr: Arrivals, config: AutoscaleConfig,
            frontier: bool = True) -> Comparison:
    fleets = FleetRuns(cluster, arr, config)
    results, wall = [], {}
    for name in names:
        t0 = time.perf_counter()
        results.append(evaluate(name, cluster, arr, config, fleets=fleets))
        wall[name] = time.perf_counter() - t0
    front: list[EvalResult] = []
    if frontier:
        t0 = time.perf_counter()
        front = static_frontier(fleets)
        wall["static frontier"] = time.perf_counter() - t0
    return Comparison(tuple(results), tuple(front), wall)
