"""Cut a cluster's free GPUs into TP groups that never cross an NVLink island.

Every TP group of a request has the same size g, so cutting each island's free GPUs into
floor(free / g) groups up front loses no capacity, and the planner is left with a pure
assignment problem (which group serves which replica and stage). Inside a multi-node NVLink
domain, node-local groups are cut first and only the remainders are pooled across nodes, which
keeps as many groups as possible inside one tray while still reaching floor(domain free / g).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hbmserve.placement.link_model import RingCost, ring_allreduce
from hbmserve.placement.topology import ClusterTopology, GpuRef, Island, NodeTopology


@dataclass(frozen=True)
class TpGroup:
    order: int  # position in cluster order: the final tie-breaker, keeps plans deterministic
    island: str
    members: tuple[GpuRef, ...]
    rack: str | None
    domain: str | None
    cost: RingCost
    island_free: int  # free GPUs its island had before cutting: best-fit keeps big islands whole

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(m.node for m in self.members)

    @property
    def first_node(self) -> str:
        return self.members[0].node


def ring_cost(topology: ClusterTopology, members: tuple[GpuRef, ...], message_bytes: int) -> RingCost:
    n = len(members)
    hops = [] if n == 1 else [topology.link(members[i], members[(i + 1) % n]) for i in range(n)]
    return ring_allreduce(hops, message_bytes)


def _chunks(refs: list[GpuRef], size: int) -> tuple[list[tuple[GpuRef, ...]], list[GpuRef]]:
    whole = len(refs) // size * size
    return [tuple(refs[i : i + size]) for i in range(0, whole, size)], refs[whole:]


def _island_groups(island: Island, free: set[GpuRef], size: int) -> list[tuple[GpuRef, ...]]:
    available = [m for m in island.members if m in free]
    if island.domain is None:
        return _chunks(available, size)[0]
    groups: list[tuple[GpuRef, ...]] = []
    leftovers: list[GpuRef] = []
    for node in island.nodes:
        local, rest = _chunks([m for m in available if m.node == node], size)
        groups.extend(local)
        leftovers.extend(rest)
    groups.extend(_chunks(leftovers, size)[0])
    return groups


def _numa_key(node: NodeTopology, gpu: int) -> tuple[str, int]:
    return (node.gpus[node.position(gpu)].numa_affinity or "", gpu)


def _pcie_groups(node: NodeTopology, free: set[GpuRef], size: int) -> list[tuple[GpuRef, ...]]:
    # Groups inside one NUMA node first; only the remainders are pooled across the socket link.
    refs = sorted((r for r in free if r.node == node.name), key=lambda r: _numa_key(node, r.gpu))
    groups: list[tuple[GpuRef, ...]] = []
    leftovers: list[GpuRef] = []
    for numa in dict.fromkeys(_numa_key(node, r.gpu)[0] for r in refs):
        local, rest = _chunks([r for r in refs if _numa_key(node, r.gpu)[0] == numa], size)
        groups.extend(local)
        leftovers.extend(rest)
    return groups + _chunks(leftovers, size)[0]


def enumerate_tp_groups(
    topology: ClusterTopology,
    group_size: int,
    in_use: Iterable[GpuRef] = (),
    allow_pcie: bool = False,
    message_bytes: int = 1,
) -> tuple[TpGroup, ...]:
    """All disjoint TP groups of `group_size` GPUs that the free GPUs allow."""
    used = set(in_use)
    free = {GpuRef(n.name, g.index) for n in topology.nodes for g in n.gpus} - used
    groups: list[TpGroup] = []

    def add(island: str, members: tuple[GpuRef, ...], domain: str | None, island_free: int) -> None:
        node = topology.node(members[0].node)
        cost = ring_cost(topology, members, message_bytes)
        groups.append(TpGroup(len(groups), island, members, node.rack, domain, cost, island_free))

    for island in topology.islands():
        available = sum(1 for m in island.members if m in free)
        for members in _island_groups(island, free, group_size):
            add(island.id, members, island.domain, available)
            free.difference_update(members)
    if allow_pcie and group_size > 1:
        for node in topology.nodes:
            if node.nvlink_domain is None:
                available = sum(1 for r in free if r.node == node.name)
                for members in _pcie_groups(node, free, group_size):
                    add(f"{node.name}-pcie", members, None, available)
                    free.difference_update(members)
    return tuple(groups)


def largest_island(topology: ClusterTopology) -> int:
    return max((island.size for island in topology.islands()), default=0)


def largest_node(topology: ClusterTopology) -> int:
    return max((len(n.gpus) for n in topology.nodes), default=0)
