"""Post-placement verification and its metrics."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

import hbmserve.placement as placement_pkg
from hbmserve.placement.cluster_file import load_cluster_file
from hbmserve.placement.io.ray_observe import log_verification
from hbmserve.placement.placement_types import PlacementRequest
from hbmserve.placement.placer import plan
from hbmserve.placement.topology import ClusterTopology
from hbmserve.placement.verification import Crossing, RankReport, verify_replica

DATA = Path(placement_pkg.__file__).parent / "data"
S = 16 * 1024 * 1024
PAIRS = load_cluster_file(DATA / "cluster_nvlink_pairs_x2.yaml")
NV4_PAIR_US = 2 * 1.0 + S / 100e9 * 1e6  # 2 ranks: 2 steps, alpha 1 us, 100 GB/s
SYS_PAIR_US = 2 * 3.0 + S / 12e9 * 1e6
NET_PAIR_US = 2 * 5.0 + S / 25e9 * 1e6


@pytest.fixture(scope="module")
def tp2():
    result = plan(PlacementRequest(tp=2), PAIRS)
    assert [(s.node, s.gpus) for s in result.replicas[0].stages] == [("pairs-a", (0, 1))]
    return result


def _verify(result, placements, topology=PAIRS):
    reports = [RankReport(rank, node, gpu_index=gpu) for rank, (node, gpu) in enumerate(placements)]
    return verify_replica(result, 0, reports, topology)


def test_exact_placement_is_verified(tp2):
    check = _verify(tp2, [("pairs-a", 0), ("pairs-a", 1)])
    assert check.placement_verified and check.warning is None
    assert check.expected_extra_allreduce_us == 0.0
    assert check.to_status_dict()["crossed"] == []


def test_other_gpus_of_the_same_island_are_fine(tp2):
    assert _verify(tp2, [("pairs-a", 1), ("pairs-a", 0)]).placement_verified


def test_group_across_islands_reports_the_extra_cost(tp2):
    check = _verify(tp2, [("pairs-a", 1), ("pairs-a", 2)])
    assert not check.placement_verified
    assert check.groups[0].crossing is Crossing.ISLAND
    assert check.expected_extra_allreduce_us == pytest.approx(SYS_PAIR_US - NV4_PAIR_US)
    assert "expected extra all-reduce" in check.warning
    status = check.to_status_dict()
    assert status["placement_verified"] is False and status["crossed"][0]["crossing"] == "island"


def test_group_across_nodes(tp2):
    check = _verify(tp2, [("pairs-a", 0), ("pairs-b", 1)])
    assert check.groups[0].crossing is Crossing.NODE
    assert check.expected_extra_allreduce_us == pytest.approx(NET_PAIR_US - NV4_PAIR_US)


def test_right_island_shape_on_the_wrong_node(tp2):
    check = _verify(tp2, [("pairs-b", 0), ("pairs-b", 1)])
    assert check.groups[0].crossing is Crossing.WRONG_NODE and not check.placement_verified
    assert check.expected_extra_allreduce_us == 0.0


def test_missing_rank_and_shared_gpu(tp2):
    missing = verify_replica(tp2, 0, [RankReport(0, "pairs-a", gpu_index=0)], PAIRS)
    assert missing.groups[0].crossing is Crossing.MISSING
    shared = _verify(tp2, [("pairs-a", 0), ("pairs-a", 0)])
    assert shared.groups[0].crossing is Crossing.SHARED_GPU


def test_gpu_identified_by_uuid_or_visible_devices():
    dgx = load_cluster_file(DATA / "cluster_dgx_h100_x2.yaml")
    nodes = tuple(
        dataclasses.replace(n, gpus=tuple(dataclasses.replace(g, uuid=f"GPU-{n.name}-{g.index}") for g in n.gpus))
        for n in dgx.nodes
    )
    cluster = ClusterTopology(nodes)
    result = plan(PlacementRequest(tp=2), cluster)
    reports = [RankReport(0, "dgx-a", gpu_uuid="gpu-dgx-a-5"), RankReport(1, "dgx-a", cuda_visible_devices="GPU-dgx-a-6")]
    check = verify_replica(result, 0, reports, cluster)
    assert check.placement_verified
    assert [str(r) for r in check.groups[0].observed] == ["dgx-a:5", "dgx-a:6"]
    by_index = verify_replica(result, 0, [RankReport(0, "dgx-a", cuda_visible_devices="3"),
                                          RankReport(1, "dgx-a", cuda_visible_devices="0,1")], cluster)
    assert by_index.groups[0].crossing is Crossing.MISSING  # "0,1" does not name one GPU


def test_log_warning_when_not_verified(tp2, caplog):
    logger = logging.getLogger("test.placement")
    with caplog.at_level(logging.INFO, logger="test.placement"):
        log_verification(_verify(tp2, [("pairs-a", 0), ("pairs-b", 1)]), logger, "llama")
    assert caplog.records[0].levelno == logging.WARNING
    assert "expected extra all-reduce" in caplog.records[0].getMessage()


def test_infeasible_plan_cannot_be_verified():
    with pytest.raises(ValueError):
        verify_replica(plan(PlacementRequest(tp=8), PAIRS, suggest=False), 0, [], PAIRS)
