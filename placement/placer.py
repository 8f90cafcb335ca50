"""The placement planner: a pure function from (request, topology) to a PlacementPlan.

Rules, in priority order:
1. a TP group never leaves its NVLink island (or multi-node NVLink domain);
2. a replica's pipeline stages sit as close as they can: same node, then same NVLink domain,
   then same rack, then anywhere (or on distinct nodes when the request says so);
3. replicas spread over racks and nodes, so one failure takes out as few as possible;
4. among equals, the cheaper ring all-reduce wins, then the island with the fewest free GPUs
   (best fit, so whole islands stay free for bigger groups of later deployments), then cluster order.
No Ray import, no I/O: the Ray adapter and the CLI act on the plan.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable

from hbmserve.placement.link_model import point_to_point_us
from hbmserve.placement.placement_types import (
    Alternative,
    AlternativeKind,
    InfeasibleReason,
    PlacementPlan,
    PlacementRequest,
    ReplicaPlacement,
    StagePlacement,
)
from hbmserve.placement.tp_groups import TpGroup, enumerate_tp_groups, largest_island, largest_node
from hbmserve.placement.topology import ClusterTopology, GpuRef


def _distance(a: TpGroup, b: TpGroup) -> int:
    if a.nodes & b.nodes:
        return 0
    if a.domain is not None and a.domain == b.domain:
        return 1
    if a.rack is not None and a.rack == b.rack:
        return 2
    return 3


class _Spread:
    """How many replicas of this plan already touch each rack and node."""

    def __init__(self) -> None:
        self.racks: Counter[str | None] = Counter()
        self.nodes: Counter[str] = Counter()

    def key(self, group: TpGroup) -> tuple[int, int]:
        return self.racks[group.rack], sum(self.nodes[n] for n in group.nodes)

    def add(self, replica: list[TpGroup]) -> None:
        for rack in {s.rack for s in replica}:
            self.racks[rack] += 1
        for node in set().union(*(s.nodes for s in replica)):
            self.nodes[node] += 1


def _allowed(group: TpGroup, chosen: list[TpGroup], distinct: bool) -> bool:
    return not distinct or not any(group.nodes & c.nodes for c in chosen)


def _assign_preferred(groups: tuple[TpGroup, ...], request: PlacementRequest) -> list[list[TpGroup]] | None:
    free = list(groups)
    spread = _Spread()
    replicas: list[list[TpGroup]] = []
    for _ in range(request.replicas):
        chosen: list[TpGroup] = []
        for stage in range(request.pp):
            candidates = [s for s in free if _allowed(s, chosen, request.pp_distinct_nodes)]
            if not candidates:
                return None
            if stage == 0:
                best = min(candidates, key=lambda s: (*spread.key(s), len(s.nodes), s.cost.microseconds,
                                                      s.island_free, s.order))
            else:
                prev = chosen[-1]
                best = min(
                    candidates,
                    key=lambda s: (_distance(prev, s), len(s.nodes), *spread.key(s), s.cost.microseconds,
                                   s.island_free, s.order),
                )
            chosen.append(best)
            free.remove(best)
        spread.add(chosen)
        replicas.append(chosen)
    return replicas


def _assign_most_room(groups: tuple[TpGroup, ...], request: PlacementRequest) -> list[list[TpGroup]] | None:
    """Distinct-node fallback: each stage goes to the node with the most free TP groups left.

    Picking the fullest nodes first is the classic optimal greedy for "every round takes one
    unit from k distinct bins", which the preferred order above can miss.
    """
    free = list(groups)
    replicas: list[list[TpGroup]] = []
    for _ in range(request.replicas):
        chosen: list[TpGroup] = []
        for _stage in range(request.pp):
            room = Counter(n for s in free for n in s.nodes)
            candidates = [s for s in free if _allowed(s, chosen, True)]
            if not candidates:
                return None
            best = min(candidates, key=lambda s: (-min(room[n] for n in s.nodes), s.order))
            chosen.append(best)
            free.remove(best)
        replicas.append(chosen)
    return replicas


def _build(topology: ClusterTopology, request: PlacementRequest, assigned: list[list[TpGroup]]) -> PlacementPlan:
    replicas = []
    for index, chosen in enumerate(assigned):
        stages = tuple(
            StagePlacement(
                stage=k,
                island=group.island,
                members=group.members,
                allreduce_us=group.cost.microseconds,
                bottleneck=None if group.cost.bottleneck is None else group.cost.bottleneck.code,
            )
            for k, group in enumerate(chosen)
        )
        handoff = sum(
            (point_to_point_us(topology.link(a.members[-1], b.members[0]), request.allreduce_bytes)
             for a, b in zip(stages, stages[1:])),
            0.0,
        )
        replicas.append(ReplicaPlacement(index, stages, handoff))
    all_stages = [s for r in replicas for s in r.stages]
    nodes = {n for s in all_stages for n in s.nodes}
    racks = {topology.rack_of(n) for n in nodes} - {None}
    pcie = sum(1 for s in all_stages if not s.over_nvlink)
    where = "every TP group inside one NVLink island" if not pcie else (
        f"{pcie} of {len(all_stages)} TP group(s) over PCIe inside one node (no NVLink island fits)"
    )
    rack_text = f" in {len(racks)} rack(s)" if racks else ""
    reason = f"{request.describe()}: {where}; {len(all_stages)} group(s) on {len(nodes)} node(s){rack_text}"
    return PlacementPlan(
        request=request,
        feasible=True,
        reason=reason,
        replicas=tuple(replicas),
        predicted_allreduce_us=max(s.allreduce_us for s in all_stages),
        predicted_handoff_us=max(r.handoff_us for r in replicas),
    )


def _an(number: int) -> str:
    return "an" if str(number).startswith("8") or number in (11, 18) else "a"


def _what(request: PlacementRequest) -> str:
    per_rank = f" x {request.gpus_per_rank} GPUs/rank" if request.gpus_per_rank > 1 else ""
    return f"TP={request.tp}{per_rank}"


def _infeasible(
    topology: ClusterTopology, request: PlacementRequest, groups: tuple[TpGroup, ...]
) -> tuple[InfeasibleReason, str]:
    g = request.group_size
    if topology.gpu_count == 0:
        return InfeasibleReason.NO_GPUS, "the topology has no GPUs"
    island = largest_island(topology)
    if g > island and not (request.allow_pcie_tp and g <= largest_node(topology)):
        if request.allow_pcie_tp:
            return InfeasibleReason.TP_EXCEEDS_ISLAND, (
                f"{_what(request)} needs {g} GPUs in one node or NVLink domain; "
                f"the largest node has {largest_node(topology)}"
            )
        return InfeasibleReason.TP_EXCEEDS_ISLAND, (
            f"{_what(request)} needs {_an(g)} {g}-GPU NVLink island; the largest here is {island}"
        )
    needed = request.replicas * request.pp
    if len(groups) < needed:
        return InfeasibleReason.INSUFFICIENT_CAPACITY, (
            f"{request.describe()} needs {needed} TP group(s) of {g} GPUs inside NVLink islands; "
            f"the free GPUs hold {len(groups)}"
        )
    with_room = len({n for s in groups for n in s.nodes})
    return InfeasibleReason.DISTINCT_NODES, (
        f"PP={request.pp} on distinct nodes for {request.replicas} replica(s) does not fit: "
        f"{len(groups)} free {g}-GPU group(s) sit on only {with_room} node(s)"
    )


def _alternatives(
    topology: ClusterTopology, request: PlacementRequest, in_use: frozenset[GpuRef]
) -> tuple[Alternative, ...]:
    def fits(candidate: PlacementRequest) -> PlacementPlan | None:
        result = plan(candidate, topology, in_use, suggest=False)
        return result if result.feasible else None

    found: list[Alternative] = []
    for tp in (t for t in range(request.tp - 1, 0, -1) if request.tp % t == 0):
        pp = request.pp * (request.tp // tp)
        if fits(dataclasses.replace(request, tp=tp, pp=pp)):
            found.append(Alternative(
                AlternativeKind.SMALLER_TP_MORE_PP, tp, pp, request.replicas,
                f"TP={tp} x PP={pp} keeps {request.gpus_per_replica} GPUs per replica; "
                "stages hand activations over once per stage instead of all-reducing every layer",
            ))
            break
    for factor, fmt in ((2, "FP8"), (4, "INT4")):
        tp = request.tp // factor
        if request.tp % factor == 0 and tp >= 1 and fits(dataclasses.replace(request, tp=tp)):
            found.append(Alternative(
                AlternativeKind.QUANTIZE, tp, request.pp, request.replicas,
                f"quantize weights to {fmt} (1/{factor} of BF16) so TP={tp} holds the model, "
                "if the KV cache still fits",
            ))
            break
    # Fewer replicas never need more room, so the largest count that fits is a binary search.
    low, high = 0, request.replicas - 1
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(dataclasses.replace(request, replicas=mid)) else (low, mid - 1)
    if low >= 1:
        found.append(Alternative(
            AlternativeKind.FEWER_REPLICAS, request.tp, request.pp, low,
            f"{low} replica(s) of TP={request.tp} x PP={request.pp} fit",
        ))
    if not request.allow_pcie_tp:
        pcie = fits(dataclasses.replace(request, allow_pcie_tp=True))
        if pcie is not None:
            found.append(Alternative(
                AlternativeKind.ALLOW_PCIE_TP, request.tp, request.pp, request.replicas,
                f"allow TP over PCIe inside one node: predicted all-reduce "
                f"{pcie.predicted_allreduce_us:.0f} us per {request.allreduce_bytes} bytes",
            ))
    return tuple(found)


def plan(
    request: PlacementRequest,
    topology: ClusterTopology,
    in_use: Iterable[GpuRef] = (),
    suggest: bool = True,
) -> PlacementPlan:
    """Place `request` on the free GPUs of `topology` (those not in `in_use`).

    `suggest=False` skips the search for alternatives when the request does not fit.
    """
    used = frozenset(in_use)
    groups = enumerate_tp_groups(
        topology, request.group_size, used, request.allow_pcie_tp, request.allreduce_bytes
    )
    assigned = _assign_preferred(groups, request)
    if assigned is None and request.pp_distinct_nodes:
        assigned = _assign_most_room(groups, request)
    if assigned is not None:
        return _build(topology, request, assigned)
    kind, reason = _infeasible(topology, request, groups)
    return PlacementPlan(
        request=request,
        feasible=False,
        reason=reason,
        infeasible=kind,
        alternatives=_alternatives(topology, request, used) if suggest else (),
    )
