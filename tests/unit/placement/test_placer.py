"""Planner decisions on the fixture clusters, against expectations derived by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hbmserve.placement as placement_pkg
from hbmserve.placement.cluster_file import load_cluster_file, parse_cluster_text
from hbmserve.placement.placement_types import AlternativeKind, InfeasibleReason, PlacementRequest
from hbmserve.placement.placer import plan
from hbmserve.placement.topology import ClusterTopology, GpuRef

DATA = Path(placement_pkg.__file__).parent / "data"
S = 16 * 1024 * 1024  # default all-reduce message


def _cluster(name):
    return load_cluster_file(DATA / name)


def _ring_us(n, alpha_us, gbps):
    return 2 * (n - 1) * alpha_us + 2 * (n - 1) / n * S / (gbps * 1e9) * 1e6


def _stages(result):
    return [[(s.node, s.gpus, s.island) for s in r.stages] for r in result.replicas]


def test_dgx_tp8_replicas_spread_over_both_nodes():
    result = plan(PlacementRequest(tp=8, replicas=2), _cluster("cluster_dgx_h100_x2.yaml"))
    assert result.feasible
    assert _stages(result) == [[("dgx-a", tuple(range(8)), "dgx-a-0")], [("dgx-b", tuple(range(8)), "dgx-b-0")]]
    assert result.predicted_allreduce_us == pytest.approx(_ring_us(8, 1.0, 450))


def test_dgx_tp8_pp2_crosses_nodes_between_stages_only():
    result = plan(PlacementRequest(tp=8, pp=2), _cluster("cluster_dgx_h100_x2.yaml"))
    assert [s.node for s in result.replicas[0].stages] == ["dgx-a", "dgx-b"]
    assert result.predicted_handoff_us == pytest.approx(5.0 + S / 25e9 * 1e6)  # one send over the network


def test_tp_larger_than_any_island_is_infeasible_with_alternatives():
    result = plan(PlacementRequest(tp=8), _cluster("cluster_nvlink_pairs_x2.yaml"))
    assert not result.feasible
    assert result.infeasible is InfeasibleReason.TP_EXCEEDS_ISLAND
    assert result.reason == "TP=8 needs an 8-GPU NVLink island; the largest here is 2"
    alternatives = {(a.kind, a.tp, a.pp, a.replicas) for a in result.alternatives}
    # 4 islands of 2 GPUs: TP=2 x PP=4 keeps 8 GPUs; TP=4 (FP8) never fits, TP=2 (INT4) does.
    assert alternatives == {
        (AlternativeKind.SMALLER_TP_MORE_PP, 2, 4, 1),
        (AlternativeKind.QUANTIZE, 2, 1, 1),
    }


def test_too_many_replicas_suggests_how_many_fit():
    result = plan(PlacementRequest(tp=2, replicas=5), _cluster("cluster_nvlink_pairs_x2.yaml"))
    assert result.infeasible is InfeasibleReason.INSUFFICIENT_CAPACITY
    assert "the free GPUs hold 4" in result.reason
    fewer = [a for a in result.alternatives if a.kind is AlternativeKind.FEWER_REPLICAS]
    assert [(a.replicas, a.tp) for a in fewer] == [(4, 2)]


def test_tp2_on_pairs_uses_bridged_pairs_and_alternates_nodes():
    result = plan(PlacementRequest(tp=2, replicas=3), _cluster("cluster_nvlink_pairs_x2.yaml"))
    assert _stages(result) == [
        [("pairs-a", (0, 1), "pairs-a-0")], [("pairs-b", (0, 1), "pairs-b-0")], [("pairs-a", (2, 3), "pairs-a-1")]]
    assert result.predicted_allreduce_us == pytest.approx(_ring_us(2, 1.0, 100))  # NV4 = 100 GB/s


def test_gpus_in_use_never_produce_a_split_pair():
    cluster = _cluster("cluster_nvlink_pairs_x2.yaml")
    result = plan(PlacementRequest(tp=2, replicas=3), cluster, in_use={GpuRef("pairs-a", 0)})
    groups = [s.members for r in result.replicas for s in r.stages]
    assert (GpuRef("pairs-a", 1), GpuRef("pairs-a", 2)) not in groups
    assert GpuRef("pairs-a", 1) not in {m for g in groups for m in g}
    assert sorted(s.island for r in result.replicas for s in r.stages) == ["pairs-a-1", "pairs-b-0", "pairs-b-1"]


def test_pcie_box_refuses_tp_unless_allowed():
    cluster = _cluster("cluster_l40s_x2.yaml")
    refused = plan(PlacementRequest(tp=2), cluster)
    assert refused.reason == "TP=2 needs a 2-GPU NVLink island; the largest here is 1"
    assert AlternativeKind.ALLOW_PCIE_TP in {a.kind for a in refused.alternatives}
    allowed = plan(PlacementRequest(tp=2, allow_pcie_tp=True), cluster)
    assert _stages(allowed) == [[("l40s-a", (0, 1), "l40s-a-pcie")]]
    assert allowed.predicted_allreduce_us == pytest.approx(_ring_us(2, 2.0, 24))  # PIX pair


def test_pcie_tp4_stays_on_one_socket():
    result = plan(PlacementRequest(tp=4, replicas=2, allow_pcie_tp=True), _cluster("cluster_l40s_x2.yaml"))
    assert [s.gpus for r in result.replicas for s in r.stages] == [(0, 1, 2, 3), (0, 1, 2, 3)]
    # ring 0-1 PIX, 1-2 NODE, 2-3 PIX, 3-0 NODE: NODE (18 GB/s, 2 us) is the bottleneck
    assert result.predicted_allreduce_us == pytest.approx(_ring_us(4, 2.0, 18))


def test_nvl72_tp8_spans_two_trays_inside_the_domain():
    result = plan(PlacementRequest(tp=8, replicas=3), _cluster("cluster_nvl72.yaml"))
    node_sets = [set(r.stages[0].nodes) for r in result.replicas]
    assert all(len(s) == 2 for s in node_sets)
    assert not (node_sets[0] & node_sets[1] or node_sets[0] & node_sets[2] or node_sets[1] & node_sets[2])
    assert {s.island for r in result.replicas for s in r.stages} == {"domain-nvl72-a"}
    assert result.predicted_allreduce_us == pytest.approx(_ring_us(8, 1.0, 450))


def test_nvl72_tp4_keeps_each_group_inside_one_tray():
    result = plan(PlacementRequest(tp=4, replicas=18), _cluster("cluster_nvl72.yaml"))
    assert sorted(r.stages[0].nodes for r in result.replicas) == [(f"gb200-t{i:02d}",) for i in range(18)]


def test_mixed_racks_replicas_land_in_different_racks():
    cluster = _cluster("cluster_mixed_racks.json")
    result = plan(PlacementRequest(tp=2, replicas=2), cluster)
    # Cheapest TP=2 slot per rack is an NV18 pair on that rack's DGX.
    assert [r.stages[0].node for r in result.replicas] == ["dgx-a1", "dgx-b2"]


def test_pipeline_stages_stay_close_same_node_then_same_rack():
    cluster = _cluster("cluster_mixed_racks.json")
    together = plan(PlacementRequest(tp=2, pp=2), cluster)
    assert [s.node for s in together.replicas[0].stages] == ["dgx-a1", "dgx-a1"]
    apart = plan(PlacementRequest(tp=2, pp=2, pp_distinct_nodes=True), cluster)
    assert [s.node for s in apart.replicas[0].stages] == ["dgx-a1", "pairs-a2"]  # same rack first


def test_distinct_nodes_beyond_node_count_is_typed():
    result = plan(PlacementRequest(tp=4, pp=3, pp_distinct_nodes=True), _cluster("cluster_dgx_h100_x2.yaml"))
    assert result.infeasible is InfeasibleReason.DISTINCT_NODES
    assert "4 free 4-GPU group(s) sit on only 2 node(s)" in result.reason


def test_distinct_nodes_fallback_uses_the_roomiest_nodes():
    pairs = (DATA / "nvlink_pairs_4x.topo.txt").read_text()
    nodes = [{"name": n, "labels": {"rack": r}, "nvlink_domain": None, "nvidia_smi_topo": pairs}
             for n, r in (("b", "r1"), ("c", "r1"), ("a", "r2"))]
    cluster = parse_cluster_text(json.dumps({"nodes": nodes}))
    busy = {GpuRef("b", 0), GpuRef("c", 0)}  # b and c keep one free pair each, a keeps two
    result = plan(PlacementRequest(tp=2, pp=2, replicas=2, pp_distinct_nodes=True), cluster, in_use=busy)
    assert result.feasible
    for replica in result.replicas:
        assert len({s.node for s in replica.stages}) == 2
    assert sorted(s.node for r in result.replicas for s in r.stages) == ["a", "a", "b", "c"]


def test_gpus_per_rank_doubles_the_group():
    result = plan(PlacementRequest(tp=2, gpus_per_rank=2), _cluster("cluster_nvlink_pairs_x2.yaml"))
    assert result.reason == "TP=2 x 2 GPUs/rank needs a 4-GPU NVLink island; the largest here is 2"


def test_more_replicas_than_gpus():
    cluster = parse_cluster_text("\tGPU0\tCPU Affinity\nGPU0\t X \t0-3\n")
    result = plan(PlacementRequest(tp=1, replicas=2), cluster)
    assert result.infeasible is InfeasibleReason.INSUFFICIENT_CAPACITY
    assert result.reason.endswith("the free GPUs hold 1")


def test_no_gpus_at_all():
    result = plan(PlacementRequest(tp=1), ClusterTopology(()))
    assert (result.feasible, result.infeasible) == (False, InfeasibleReason.NO_GPUS)


def test_json_has_the_cli_contract_keys():
    doc = plan(PlacementRequest(tp=2), _cluster("cluster_nvlink_pairs_x2.yaml")).to_json_dict()
    assert {"feasible", "reason", "replicas", "predicted_allreduce_us", "alternatives"} <= set(doc)
    stage = doc["replicas"][0]["stages"][0]
    assert (stage["node"], stage["gpus"], stage["island"]) == ("pairs-a", [0, 1], "pairs-a-0")
    json.dumps(doc)


@pytest.mark.parametrize("field", ["tp", "pp", "replicas", "gpus_per_rank", "allreduce_bytes"])
def test_request_validation_names_the_field(field):
    with pytest.raises(ValueError, match=field):
        PlacementRequest(**{"tp": 1, field: 0})


def test_best_fit_prefers_the_partly_used_island():
    dgx = _cluster("cluster_dgx_h100_x2.yaml")
    busy = {GpuRef("dgx-b", g) for g in range(4)}
    result = plan(PlacementRequest(tp=4), dgx, in_use=busy)
    # Equal spread and equal NV18 cost: the 4 free GPUs of dgx-b fit exactly, dgx-a stays whole.
    assert [(s.node, s.gpus) for s in result.replicas[0].stages] == [("dgx-b", (4, 5, 6, 7))]


def test_pcie_groups_stay_inside_a_socket_when_they_can():
    cluster = parse_cluster_text((DATA / "l40s_8x.topo.txt").read_text())
    result = plan(PlacementRequest(tp=2, replicas=3, allow_pcie_tp=True), cluster, in_use={GpuRef("node0", 0)})
    groups = sorted(s.gpus for r in result.replicas for s in r.stages)
    assert groups == [(1, 2), (4, 5), (6, 7)]  # GPU 3 is left over rather than paired across sockets
