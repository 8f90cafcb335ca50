"""Post-placement verification: do the ranks sit where the plan put them?

After a replica starts, each rank reports its node and GPU (index, UUID, or
CUDA_VISIBLE_DEVICES). This pure function compares the reports with the plan: a replica is
verified when every rank is on its planned node and every TP group lies inside one NVLink
island. A different GPU inside the same island is fine (Ray chooses physical IDs); a group that
spans islands or nodes is not, and the result carries the extra all-reduce time it will cost.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from hbmserve.placement.placement_types import PlacementPlan, StagePlacement
from hbmserve.placement.tp_groups import ring_cost
from hbmserve.placement.topology import ClusterTopology, GpuRef


class Crossing(enum.Enum):
    NONE = "none"
    MISSING = "missing"  # a rank did not report, or reported a GPU we cannot map
    SHARED_GPU = "shared_gpu"  # two ranks of the replica on one GPU
    WRONG_NODE = "wrong_node"  # inside one island, but not on the planned node
    ISLAND = "island"  # one node, more than one NVLink island
    NODE = "node"  # more than one node, outside a shared NVLink domain


@dataclass(frozen=True)
class RankReport:
    rank: int
    node: str
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    cuda_visible_devices: str | None = None  # used when it names exactly one GPU


@dataclass(frozen=True)
class GroupCheck:
    stage: int
    planned_island: str
    planned: tuple[GpuRef, ...]
    observed: tuple[GpuRef | None, ...]
    crossing: Crossing
    planned_allreduce_us: float
    observed_allreduce_us: float | None

    @property
    def extra_allreduce_us(self) -> float:
        if self.observed_allreduce_us is None:
            return 0.0
        return max(0.0, self.observed_allreduce_us - self.planned_allreduce_us)

    def describe(self) -> str:
        seen = ", ".join("?" if r is None else str(r) for r in self.observed)
        return f"stage {self.stage} TP group ({seen}) {self.crossing.value}"


@dataclass(frozen=True)
class VerificationResult:
    replica: int
    placement_verified: bool
    groups: tuple[GroupCheck, ...]
    reason: str
    expected_extra_allreduce_us: float
    warning: str | None  # what to log when not verified

    def to_status_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "placement_verified": self.placement_verified,
            "reason": self.reason,
            "crossed": [
                {"stage": g.stage, "crossing": g.crossing.value, "planned_island": g.planned_island,
                 "observed": [None if r is None else str(r) for r in g.observed],
                 "extra_allreduce_us": round(g.extra_allreduce_us, 3)}
                for g in self.groups
                if g.crossing is not Crossing.NONE
            ],
            "expected_extra_allreduce_us": round(self.expected_extra_allreduce_us, 3),
        }


def _resolve(report: RankReport, topology: ClusterTopology) -> GpuRef | None:
    try:
        node = topology.node(report.node)
    except KeyError:
        return None
    if report.gpu_index is not None:
        return GpuRef(node.name, report.gpu_index) if any(g.index == report.gpu_index for g in node.gpus) else None
    uuid = report.gpu_uuid
    visible = (report.cuda_visible_devices or "").strip()
    if uuid is None and visible and "," not in visible:
        if visible.isdigit():
            index = int(visible)
            return GpuRef(node.name, index) if any(g.index == index for g in node.gpus) else None
        uuid = visible
    if uuid is not None:
        for gpu in node.gpus:
            if gpu.uuid is not None and gpu.uuid.lower() == uuid.lower():
                return GpuRef(node.name, gpu.index)
    return None


def _check(stage: StagePlacement, observed: tuple[GpuRef | None, ...], topology: ClusterTopology,
           message_bytes: int) -> GroupCheck:
    def result(crossing: Crossing, cost: float | None) -> GroupCheck:
        return GroupCheck(stage.stage, stage.island, stage.members, observed, crossing,
                          stage.allreduce_us, cost)

    if any(r is None for r in observed):
        return result(Crossing.MISSING, None)
    refs = tuple(r for r in observed if r is not None)
    if len(set(refs)) != len(refs):
        return result(Crossing.SHARED_GPU, None)  # two ranks on one GPU: no ring to price
    cost = ring_cost(topology, refs, message_bytes).microseconds
    islands = {topology.island_of(r).id for r in refs}
    if len(islands) > 1:
        nodes = {r.node for r in refs}
        return result(Crossing.NODE if len(nodes) > 1 else Crossing.ISLAND, cost)
    if [r.node for r in refs] != [m.node for m in stage.members]:
        return result(Crossing.WRONG_NODE, cost)
    return result(Crossing.NONE, cost)


def verify_replica(
    plan: PlacementPlan,
    replica_index: int,
    reports: list[RankReport],
    topology: ClusterTopology,
) -> VerificationResult:
    """Compare one replica's rank reports with its plan."""
    if not plan.feasible:
        raise ValueError("an infeasible plan has nothing to verify")
    replica = plan.replicas[replica_index]
    per_rank = plan.request.gpus_per_rank
    by_rank = {r.rank: _resolve(r, topology) for r in reports}
    seen: list[GpuRef] = []
    groups = []
    for stage in replica.stages:
        ranks = [stage.stage * plan.request.tp + pos // per_rank for pos in range(0, len(stage.members), per_rank)]
        observed = tuple(by_rank.get(rank) for rank in ranks)
        check = _check(stage, observed, topology, plan.request.allreduce_bytes)
        clash = [r for r in observed if r is not None and r in seen]
        seen.extend(r for r in observed if r is not None)
        if clash and check.crossing is Crossing.NONE:
            check = GroupCheck(check.stage, check.planned_island, check.planned, observed,
                               Crossing.SHARED_GPU, check.planned_allreduce_us, check.observed_allreduce_us)
        groups.append(check)

    bad = [g for g in groups if g.crossing is not Crossing.NONE]
    extra = sum(g.extra_allreduce_us for g in groups)
    if not bad:
        return VerificationResult(replica.index, True, tuple(groups),
                                  f"replica {replica.index}: every TP group on its planned node(s), "
                                  "inside one NVLink island", 0.0, None)
    reason = f"replica {replica.index}: " + "; ".join(g.describe() for g in bad)
    warning = (f"{reason}; expected extra all-reduce {extra:.0f} us per "
               f"{plan.request.allreduce_bytes} bytes per step")
    return VerificationResult(replica.index, False, tuple(groups), reason, extra, warning)
