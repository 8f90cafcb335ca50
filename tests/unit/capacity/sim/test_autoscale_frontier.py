"""The static frontier (capacity/sim/frontier.py), dominance, and the oracle as the limit of every fixed
fleet (capacity/sim/oracle_search.py step 5, `assert_oracle_is_the_limit`).

The small cluster (conftest.py: 1-4 replicas, a 60 s cold start) on short traces keeps the
real replays fast; the crafted points test the rules by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hbmserve.autoscale.registry import POLICIES
from hbmserve.capacity.sim.comparison import compare
from hbmserve.capacity.sim.evaluate import EvalResult, eval_config
from hbmserve.capacity.sim.frontier import FleetRuns, dominated_by, dominates, static_frontier
from hbmserve.capacity.sim.oracle_search import (OracleUndercut, assert_oracle_is_the_limit, plan_oracle,
                                        undercut_oracle)
from hbmserve.capacity.traces.arrivals import Arrivals


@pytest.fixture
def cluster(small_cluster):
    return small_cluster


def lulls_and_bursts() -> Arrivals:
    """1 req/s, a minute at 12 req/s, a minute's lull at 1, 12 again, 1: a lull shorter than
    a cold start plus a burst, the shape where a fixed fleet beats scaling."""
    per_min = [60, 720, 60, 720, 60]
    t = np.concatenate([np.linspace(60 * i, 60 * (i + 1), n, endpoint=False)
                        for i, n in enumerate(per_min)])
    return Arrivals(t, np.full(len(t), 1500, dtype=np.int64), np.full(len(t), 20, dtype=np.int64))


@pytest.fixture(scope="module")
def base(small_cluster) -> EvalResult:
    arr = lulls_and_bursts().window(0.0, 20.0)
    return FleetRuns(small_cluster, arr, eval_config(small_cluster, arr))(1)


def point(base: EvalResult, name: str, slo: float, gpu_h: float) -> EvalResult:
    return dataclasses.replace(base, policy=name, summary=dataclasses.replace(
        base.summary, slo_attainment=slo, gpu_hours=gpu_h))


def test_dominated_means_at_least_the_attainment_for_no_more_gpu_hours(base):
    fleets = [point(base, "fixed-1", 0.90, 4.0), point(base, "fixed-2", 0.99, 8.0),
              point(base, "fixed-3", 1.00, 12.0)]
    assert dominated_by(point(base, "p", 0.95, 9.0), fleets) == ["fixed-2"]
    assert dominated_by(point(base, "p", 0.99, 8.5), fleets) == ["fixed-2"]
    assert dominated_by(point(base, "p", 0.99, 12.0), fleets) == ["fixed-2", "fixed-3"]
    assert dominated_by(point(base, "p", 0.995, 7.0), fleets) == []  # above the curve
    assert dominated_by(point(base, "p", 0.89, 3.9), fleets) == []  # cheaper than any
    # the same point is not dominated (static-peak at 2 replicas is fixed-2)
    assert not dominates(fleets[1], point(base, "static-peak", 0.99, 8.0))
    assert dominates(fleets[1], point(base, "p", 0.99, 8.0 + 1e-9))


class Crafted(FleetRuns):
    """Fixed-fleet 'runs' at hand-set points: `template(n)` relabelled, with the (SLO
    attainment, GPU-hours) of `points` where it names n."""

    def __init__(self, cluster, arr, config, template, points: dict[int, tuple[float, float]]):
        super().__init__(cluster, arr, config)
        self.template, self.points, self.asked = template, points, []

    def __call__(self, n: int) -> EvalResult:
        self.asked.append(n)
        r = self.template(n)
        slo, gpu_h = self.points.get(n, (r.summary.slo_attainment, r.summary.gpu_hours))
        return point(r, f"fixed-{n}", slo, gpu_h)


def test_the_frontier_stops_where_no_larger_fleet_can_matter(cluster, base):
    arr = lulls_and_bursts()
    config = eval_config(cluster, arr)
    # Least bills: n x 4 GPUs x the last arrival (~300 s) = 0.33 n GPU-h.
    least = FleetRuns(cluster, arr, config).least_gpu_hours
    assert least(3) == pytest.approx(3 * 4 * float(arr.t[-1]) / 3600)

    def frontier(points):
        return [r.policy for r in static_frontier(Crafted(cluster, arr, config, lambda n: base,
                                                          points))]

    # Fleet 2 meets the SLO for every request at 0.8 GPU-h: fleet 3's least bill (~1.0) is
    # above it, so 3 and 4 are not replayed.
    assert frontier({1: (0.9, 0.4), 2: (1.0, 0.8), 3: (1.0, 1.2), 4: (1.0, 1.6)}) == [
        "fixed-1", "fixed-2"]
    # A 100% fleet at 5 GPU-h leaves room below; the cheapest 100% so far (fleet 3 at 1.2)
    # then stops the curve before fleet 4 (least bill ~1.33).
    assert frontier({1: (1.0, 5.0), 2: (0.95, 0.8), 3: (1.0, 1.2), 4: (0.9, 1.6)}) == [
        "fixed-1", "fixed-2", "fixed-3"]
    # No fleet reaches 100%: every size is on the curve.
    assert frontier({n: (0.9, 0.4 * n) for n in range(1, 5)}) == [f"fixed-{n}" for n in
                                                                 range(1, 5)]


def test_the_oracle_takes_a_fixed_fleet_that_is_cheaper_than_its_schedule(cluster):
    arr = lulls_and_bursts()
    config = eval_config(cluster, arr)
    real = FleetRuns(cluster, arr, config)
    own = plan_oracle(cluster, arr, config, fleets=real)
    assert own.config.schedule != ((0.0, 1),)
    # Only fleets whose least bill is below the kept schedule's are worth a replay: here the
    # fleet of 1 (2 would cost at least 2 x 4 GPUs x the last arrival, above the schedule).
    assert own.result.detail["oracle"]["fixed_fleets_tried"] == [
        n for n in real.sizes if real.least_gpu_hours(n) < own.result.summary.gpu_hours]
    # Craft a fleet of 1 that reaches the ceiling's attainment, billed 2 % over its least bill,
    # below the schedule the search kept: the oracle must take it.
    ceiling = real(config.max_replicas).summary.slo_attainment
    cheap = 1.02 * real.least_gpu_hours(1)
    assert cheap < own.result.summary.gpu_hours
    plan = plan_oracle(cluster, arr, config,
                       fleets=Crafted(cluster, arr, config, real, {1: (ceiling, cheap)}))
    assert plan.config.schedule == ((0.0, 1),)
    assert plan.result.policy == "oracle" and plan.result.summary.gpu_hours == cheap
    assert plan.result.detail["oracle"]["schedule"] == "a fixed fleet of 1"


def test_no_fixed_fleet_or_policy_undercuts_the_oracle_on_lulls_and_bursts(cluster, monkeypatch):
    from hbmserve.capacity.sim import frontier

    replayed = []

    def counted(label, *args):
        replayed.append(label)
        return real_run(label, *args)

    real_run = frontier.run_policy
    monkeypatch.setattr(frontier, "run_policy", counted)
    arr = lulls_and_bursts()
    config = eval_config(cluster, arr)
    c = compare(["hbmserve", "static-peak", "k8s-hpa", "keda", "oracle"], cluster, arr, config)
    # the oracle's search and the frontier share their fixed-fleet replays: each fleet runs once
    assert sorted(replayed) == sorted(set(replayed))
    assert {r.policy for r in c.frontier} <= set(replayed)
    assert [r.policy for r in c.frontier] == [f"fixed-{n}" for n in range(1, len(c.frontier) + 1)]
    # fixed-1 misses most of the bursts; the curve runs to max_replicas or stops only where
    # the next size's least bill reaches the cheapest fleet that met the SLO for every request
    assert c.frontier[0].summary.slo_attainment < 0.5 and len(c.frontier) >= 2
    full = [r.summary.gpu_hours for r in c.frontier if r.summary.slo_attainment >= 1.0]
    after = len(c.frontier) + 1
    assert after > config.max_replicas or (
        full and FleetRuns(cluster, arr, config).least_gpu_hours(after) >= min(full))
    assert undercut_oracle([*c.results, *c.frontier], c.oracle) == []
    c.check()
    # static-peak at n replicas is the fleet of n, the same point: never dominated by it
    peak = next(r for r in c.results if r.policy == "static-peak")
    n = POLICIES["static-peak"].make_config(config, arr.rate_peak()).replicas
    assert FleetRuns(cluster, arr, config)(n).summary == peak.summary
    assert f"fixed-{n}" not in c.dominated_by(peak)


def test_the_check_fails_loudly_naming_the_fleet_that_beats_the_oracle(base):
    oracle = point(base, "oracle", 0.999, 13.9)
    fleets = [point(base, "fixed-2", 0.988, 8.0), point(base, "fixed-3", 1.0, 12.0),
              point(base, "fixed-4", 1.0, 16.0)]
    with pytest.raises(OracleUndercut, match=r"fixed-3 100\.00% at 12\.00 GPU-h") as err:
        assert_oracle_is_the_limit([oracle, *fleets], oracle)
    assert "fixed-2" not in str(err.value) and "fixed-4" not in str(err.value)
    assert_oracle_is_the_limit([oracle, fleets[0], fleets[2]], oracle)  # neither undercuts
