"""Topology-blind PACK, the baseline the planner is compared against, and the shared scoring.

PACK is modelled the way the benchmark brief states Ray behaves when nothing tells it about
islands: fill nodes in cluster order, GPUs in index order, one bundle per GPU, skipping GPUs in
use; consecutive ranks form a TP group. (Real Ray PACK is best-effort and may also split a
group across nodes when a node is partly full - ray issue 59547 - which this model shows too.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hbmserve.placement.placement_types import PlacementPlan, PlacementRequest
from hbmserve.placement.tp_groups import ring_cost
from hbmserve.placement.topology import ClusterTopology, GpuRef


@dataclass(frozen=True)
class GroupOutcome:
    members: tuple[GpuRef, ...]
    crosses_island: bool
    crosses_node: bool
    allreduce_us: float


def pack_groups(
    request: PlacementRequest, topology: ClusterTopology, in_use: Iterable[GpuRef] = ()
) -> list[tuple[GpuRef, ...]] | None:
    """TP groups (member tuples, replica-major then stage) PACK would form; None if GPUs run out."""
    used = set(in_use)
    free = [GpuRef(n.name, g.index) for n in topology.nodes for g in sorted(n.gpus, key=lambda g: g.index)]
    free = [r for r in free if r not in used]
    need = request.gpus_per_replica * request.replicas
    if need > len(free):
        return None
    taken = free[:need]
    size = request.group_size
    return [tuple(taken[i : i + size]) for i in range(0, need, size)]


def plan_groups(plan: PlacementPlan) -> list[tuple[GpuRef, ...]]:
    return [stage.members for replica in plan.replicas for stage in replica.stages]


def score_groups(
    groups: Sequence[tuple[GpuRef, ...]], topology: ClusterTopology, message_bytes: int
) -> tuple[GroupOutcome, ...]:
    island_of = {m: island.id for island in topology.islands() for m in island.members}
    return tuple(
        GroupOutcome(
            members=group,
            crosses_island=len({island_of[m] for m in group}) > 1,
            crosses_node=len({m.node for m in group}) > 1,
            allreduce_us=ring_cost(topology, group, message_bytes).microseconds,
        )
        for group in groups
    )
