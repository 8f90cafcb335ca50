"""Placement planner vs topology-blind PACK on the fixture clusters.

Each scenario deploys a sequence of models (smaller "sidecar" deployments first, as on a shared
cluster) with both policies:
- planner: `hbmserve.placement.placer.plan`, GPUs of earlier deployments passed as `in_use`;
- PACK: fill nodes in cluster order, GPUs in index order, ignoring islands
  (`hbmserve.placement.pack_baseline.pack_groups`).
For every TP group of size > 1 it scores whether the group crosses an NVLink island or a node
and its predicted ring all-reduce time (the local link model, 16 MiB per all-reduce). These are
model predictions, not measurements; only the planner's run time is measured (median of runs).

    .venv/bin/python ops/bench/placement_vs_pack.py [--out out/placement_vs_pack.json] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import hbmserve.placement as placement_pkg
from hbmserve.placement.cluster_file import load_cluster_file
from hbmserve.placement.link_model import DEFAULT_ALLREDUCE_BYTES
from hbmserve.placement.pack_baseline import GroupOutcome, pack_groups, plan_groups, score_groups
from hbmserve.placement.placement_types import PlacementRequest
from hbmserve.placement.placer import plan
from hbmserve.placement.topology import ClusterTopology, GpuRef

DATA = Path(placement_pkg.__file__).parent / "data"


@dataclass(frozen=True)
class Scenario:
    name: str
    cluster: str
    deployments: tuple[PlacementRequest, ...]


def R(tp: int, pp: int = 1, replicas: int = 1, pcie: bool = False) -> PlacementRequest:
    return PlacementRequest(tp=tp, pp=pp, replicas=replicas, allow_pcie_tp=pcie)


SCENARIOS = (
    Scenario("dgx-h100 x2: TP=8 x2", "cluster_dgx_h100_x2.yaml", (R(8, replicas=2),)),
    Scenario("dgx-h100 x2: 2 sidecars TP=1, then TP=4 x2", "cluster_dgx_h100_x2.yaml",
             (R(1, replicas=2), R(4, replicas=2))),
    Scenario("dgx-h100 x2: 2 sidecars TP=1, then TP=4 PP=2", "cluster_dgx_h100_x2.yaml",
             (R(1, replicas=2), R(4, pp=2))),
    Scenario("nvlink-pairs x2: 1 sidecar TP=1, then TP=2 x3", "cluster_nvlink_pairs_x2.yaml",
             (R(1), R(2, replicas=3))),
    Scenario("nvlink-pairs x2: TP=4", "cluster_nvlink_pairs_x2.yaml", (R(4),)),
    Scenario("nvlink-pairs x2: TP=2 PP=2 (planner's alternative)", "cluster_nvlink_pairs_x2.yaml",
             (R(2, pp=2),)),
    Scenario("l40s x2 (PCIe TP allowed): 1 sidecar TP=1, then TP=2 x4", "cluster_l40s_x2.yaml",
             (R(1), R(2, replicas=4, pcie=True))),
    Scenario("nvl72: TP=8 x9", "cluster_nvl72.yaml", (R(8, replicas=9),)),
    Scenario("mixed racks: TP=8 x2, then TP=2 x4", "cluster_mixed_racks.json",
             (R(8, replicas=2), R(2, replicas=4))),
)


@dataclass(frozen=True)
class PolicyResult:
    requested_groups: int
    groups: tuple[GroupOutcome, ...]
    refused: tuple[str, ...]  # reasons for deployments the policy could not place

    def summary(self) -> dict[str, object]:
        multi = [g for g in self.groups if len(g.members) > 1]
        costs = [g.allreduce_us for g in multi]
        return {
            "groups_placed": len(self.groups),
            "groups_requested": self.requested_groups,
            "tp_groups": len(multi),
            "cross_island_fraction": _fraction(sum(g.crosses_island for g in multi), len(multi)),
            "cross_node_fraction": _fraction(sum(g.crosses_node for g in multi), len(multi)),
            "mean_allreduce_us": round(statistics.fmean(costs), 1) if costs else None,
            "max_allreduce_us": round(max(costs), 1) if costs else None,
            "refused": list(self.refused),
        }


def _fraction(part: int, whole: int) -> float | None:
    return round(part / whole, 3) if whole else None


def _requested(scenario: Scenario) -> int:
    return sum(d.replicas * d.pp for d in scenario.deployments)


def run_planner(scenario: Scenario, topology: ClusterTopology) -> PolicyResult:
    used: set[GpuRef] = set()
    groups: list[tuple[GpuRef, ...]] = []
    refused: list[str] = []
    for request in scenario.deployments:
        result = plan(request, topology, used)
        if not result.feasible:
            alts = "; ".join(f"{a.kind.value} TP={a.tp} PP={a.pp} x{a.replicas}" for a in result.alternatives)
            refused.append(f"{result.reason} (alternatives: {alts or 'none'})")
            continue
        placed = plan_groups(result)
        groups.extend(placed)
        used.update(m for g in placed for m in g)
    return PolicyResult(_requested(scenario), score_groups(groups, topology, DEFAULT_ALLREDUCE_BYTES), tuple(refused))


def run_pack(scenario: Scenario, topology: ClusterTopology) -> PolicyResult:
    used: set[GpuRef] = set()
    groups: list[tuple[GpuRef, ...]] = []
    refused: list[str] = []
    for request in scenario.deployments:
        placed = pack_groups(request, topology, used)
        if placed is None:
            refused.append(f"{request.describe()}: not enough free GPUs")
            continue
        groups.extend(placed)
        used.update(m for g in placed for m in g)
    return PolicyResult(_requested(scenario), score_groups(groups, topology, DEFAULT_ALLREDUCE_BYTES), tuple(refused))


def _median_plan_ms(scenario: Scenario, topology: ClusterTopology, runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        run_planner(scenario, topology)
        samples.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(samples), 2)


def _pct(value: object) -> str:
    return "-" if value is None else f"{float(value) * 100:.0f}%"  # type: ignore[arg-type]


def _us(value: object) -> str:
    return "-" if value is None else f"{float(value):.0f}"  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/placement_vs_pack.json"))
    parser.add_argument("--runs", type=int, default=5, help="timed planner runs per scenario (median)")
    args = parser.parse_args()

    rows = []
    for scenario in SCENARIOS:
        topology = load_cluster_file(DATA / scenario.cluster)
        rows.append({
            "scenario": scenario.name,
            "cluster": scenario.cluster,
            "planner": run_planner(scenario, topology).summary(),
            "pack": run_pack(scenario, topology).summary(),
            "planner_median_ms": _median_plan_ms(scenario, topology, args.runs),
        })

    header = ("| scenario | policy | groups placed | TP groups crossing island | crossing node "
              "| mean all-reduce us | max all-reduce us |")
    lines = [header, "|---|---|---|---|---|---|---|"]
    for row in rows:
        for policy in ("planner", "pack"):
            s = row[policy]
            lines.append(f"| {row['scenario']} | {policy} | {s['groups_placed']}/{s['groups_requested']} "
                         f"| {_pct(s['cross_island_fraction'])} | {_pct(s['cross_node_fraction'])} "
                         f"| {_us(s['mean_allreduce_us'])} | {_us(s['max_allreduce_us'])} |")
    print("\n".join(lines))
    for row in rows:
        for reason in row["planner"]["refused"]:
            print(f"planner refused in '{row['scenario']}': {reason}")
    print("planner run time per scenario, median ms: "
          + ", ".join(f"{r['planner_median_ms']}" for r in rows))

    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "placement_vs_pack",
        "allreduce_bytes": DEFAULT_ALLREDUCE_BYTES,
        "baseline": "topology-blind PACK: fill nodes in order, GPUs in index order",
        "runs": args.runs,
        "scenarios": rows,
    }
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
