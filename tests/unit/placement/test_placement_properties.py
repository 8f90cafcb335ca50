"""Property tests of the planner over random clusters built from real and random node shapes.

Capacities are computed here from first principles, not from the planner's slot code:
- a TP group of g GPUs must sit inside one island, so an island with f free GPUs holds at most
  floor(f / g) groups and the cluster at most the sum over islands;
- with stages on distinct nodes, R replicas of PP stages fit iff sum_i min(c_i, R) >= R * PP,
  where c_i is node i's group count (Gale-Ryser with equal row sums).
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hbmserve.placement as placement_pkg
from hbmserve.placement.placement_types import PlacementRequest
from hbmserve.placement.placer import plan
from hbmserve.placement.topo_text import parse_topo_text
from hbmserve.placement.topology import ClusterTopology, Gpu, GpuRef, Link, NodeTopology, PathKind

DATA = Path(placement_pkg.__file__).parent / "data"
SHAPES = {name: (DATA / f"{name}.topo.txt").read_text()
          for name in ("dgx_h100", "l40s_8x", "nvlink_pairs_4x", "gb200_tray")}


@st.composite
def random_node(draw, name: str) -> NodeTopology:
    """A node with an arbitrary symmetric NVLink graph (PCIe elsewhere)."""
    n = draw(st.integers(1, 8))
    links = [[Link(PathKind.SELF) if i == j else Link(PathKind.SYS) for j in range(n)] for i in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            if draw(st.booleans()):
                count = draw(st.sampled_from([1, 2, 4, 12, 18]))
                links[i][j] = links[j][i] = Link(PathKind.NVLINK, count)
    rack = draw(st.sampled_from([None, "r1", "r2"]))
    gpus = tuple(Gpu(index=i, numa_affinity=str(i * 2 // n)) for i in range(n))
    return NodeTopology(name, gpus, tuple(tuple(r) for r in links), rack=rack)


@st.composite
def clusters(draw, allow_domains: bool = True) -> ClusterTopology:
    count = draw(st.integers(1, 5))
    nodes = []
    for k in range(count):
        kind = draw(st.sampled_from(["random", *SHAPES]))
        name = f"n{k}"
        if kind == "random":
            nodes.append(draw(random_node(name)))
            continue
        domain = None
        if kind == "gb200_tray" and allow_domains:
            domain = draw(st.sampled_from([None, "d1", "d2"]))
        rack = draw(st.sampled_from([None, "r1", "r2"]))
        nodes.append(parse_topo_text(SHAPES[kind], name, nvlink_domain=domain, rack=rack))
    return ClusterTopology(tuple(nodes))


@st.composite
def scenario(draw, allow_domains: bool = True):
    cluster = draw(clusters(allow_domains))
    every = [GpuRef(n.name, g.index) for n in cluster.nodes for g in n.gpus]
    busy = draw(st.sets(st.sampled_from(every))) if every else set()
    request = PlacementRequest(
        tp=draw(st.sampled_from([1, 2, 4, 8])),
        pp=draw(st.integers(1, 3)),
        replicas=draw(st.integers(1, 4)),
        gpus_per_rank=draw(st.sampled_from([1, 1, 1, 2])),
        pp_distinct_nodes=draw(st.booleans()),
        allow_pcie_tp=draw(st.booleans()),
    )
    return cluster, frozenset(busy), request


def _island_capacity(cluster: ClusterTopology, busy: frozenset[GpuRef], g: int) -> dict[str, int]:
    """Groups each node can host inside its own islands (domain islands reported under 'domain:')."""
    per: dict[str, int] = {}
    for island in cluster.islands():
        free = sum(1 for m in island.members if m not in busy)
        key = f"domain:{island.id}" if island.domain else island.members[0].node
        per[key] = per.get(key, 0) + free // g
    return per


SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(scenario())
def test_no_gpu_used_twice_and_busy_gpus_untouched(case):
    cluster, busy, request = case
    result = plan(request, cluster, busy, suggest=False)
    if not result.feasible:
        assert result.infeasible is not None and result.reason
        return
    members = [m for r in result.replicas for m in r.members]
    assert len(members) == len(set(members)) == request.gpus_per_replica * request.replicas
    assert not set(members) & busy
    assert len(result.replicas) == request.replicas
    assert all(len(r.stages) == request.pp for r in result.replicas)
    assert all(len(s.members) == request.group_size for r in result.replicas for s in r.stages)


@SETTINGS
@given(scenario())
def test_every_tp_group_inside_one_island(case):
    cluster, busy, request = case
    result = plan(request, cluster, busy, suggest=False)
    island_of = {m: i.id for i in cluster.islands() for m in i.members}
    for replica in result.replicas:
        for stage in replica.stages:
            if stage.over_nvlink:
                assert {island_of[m] for m in stage.members} == {stage.island}
            else:  # a PCIe group is allowed only on request, and never leaves its node
                assert request.allow_pcie_tp and len(stage.nodes) == 1


@SETTINGS
@given(scenario())
def test_feasible_whenever_islands_have_room(case):
    cluster, busy, request = case
    request = PlacementRequest(tp=request.tp, pp=request.pp, replicas=request.replicas,
                               gpus_per_rank=request.gpus_per_rank)
    capacity = sum(_island_capacity(cluster, busy, request.group_size).values())
    result = plan(request, cluster, busy, suggest=False)
    assert result.feasible == (capacity >= request.replicas * request.pp), result.reason


@SETTINGS
@given(scenario(allow_domains=False))
def test_distinct_nodes_are_honoured_and_found_whenever_possible(case):
    cluster, busy, request = case
    request = PlacementRequest(tp=request.tp, pp=request.pp, replicas=request.replicas,
                               gpus_per_rank=request.gpus_per_rank, pp_distinct_nodes=True)
    per_node = _island_capacity(cluster, busy, request.group_size)
    possible = sum(min(c, request.replicas) for c in per_node.values()) >= request.replicas * request.pp
    result = plan(request, cluster, busy, suggest=False)
    assert result.feasible == possible, result.reason
    for replica in result.replicas:
        nodes = [s.node for s in replica.stages]
        assert len(nodes) == len(set(nodes))


@SETTINGS
@given(scenario())
def test_alternatives_are_themselves_feasible(case):
    cluster, busy, request = case
    result = plan(request, cluster, busy)
    for alt in result.alternatives:
        retry = PlacementRequest(tp=alt.tp, pp=alt.pp, replicas=alt.replicas,
                                 gpus_per_rank=request.gpus_per_rank,
                                 pp_distinct_nodes=request.pp_distinct_nodes,
                                 allow_pcie_tp=request.allow_pcie_tp or alt.kind.value == "allow_pcie_tp")
        assert plan(retry, cluster, busy, suggest=False).feasible, alt
