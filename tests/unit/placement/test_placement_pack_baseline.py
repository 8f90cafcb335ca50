"""The topology-blind PACK model used as the benchmark baseline."""

from __future__ import annotations

from pathlib import Path

import pytest

import hbmserve.placement as placement_pkg
from hbmserve.placement.cluster_file import load_cluster_file
from hbmserve.placement.pack_baseline import pack_groups, plan_groups, score_groups
from hbmserve.placement.placement_types import PlacementRequest
from hbmserve.placement.placer import plan
from hbmserve.placement.topology import GpuRef

DATA = Path(placement_pkg.__file__).parent / "data"
S = 16 * 1024 * 1024


def _refs(node, gpus):
    return tuple(GpuRef(node, g) for g in gpus)


def test_pack_fills_nodes_in_order_and_splits_a_group_across_nodes():
    dgx = load_cluster_file(DATA / "cluster_dgx_h100_x2.yaml")
    busy = set(_refs("dgx-a", [0, 1, 2]))  # three TP=1 replicas packed first
    groups = pack_groups(PlacementRequest(tp=4, replicas=3), dgx, busy)
    assert groups == [_refs("dgx-a", [3, 4, 5, 6]), _refs("dgx-a", [7]) + _refs("dgx-b", [0, 1, 2]),
                      _refs("dgx-b", [3, 4, 5, 6])]
    scored = score_groups(groups, dgx, S)
    assert [(g.crosses_node, g.crosses_island) for g in scored] == [(False, False), (True, True), (False, False)]
    # The split group's ring has two network hops: 25 GB/s, 5 us per step.
    assert scored[1].allreduce_us == pytest.approx(6 * 5.0 + 6 / 4 * S / 25e9 * 1e6)


def test_pack_ignores_nvlink_pairs():
    pairs = load_cluster_file(DATA / "cluster_nvlink_pairs_x2.yaml")
    groups = pack_groups(PlacementRequest(tp=2), pairs, {GpuRef("pairs-a", 0)})
    assert groups == [_refs("pairs-a", [1, 2])]
    assert score_groups(groups, pairs, S)[0].crosses_island


def test_pack_runs_out_of_gpus():
    pairs = load_cluster_file(DATA / "cluster_nvlink_pairs_x2.yaml")
    assert pack_groups(PlacementRequest(tp=4, replicas=3), pairs) is None


def test_planner_groups_never_cross_where_pack_does():
    dgx = load_cluster_file(DATA / "cluster_dgx_h100_x2.yaml")
    busy = set(_refs("dgx-a", [0, 1, 2]))
    result = plan(PlacementRequest(tp=4, replicas=3), dgx, busy)
    scored = score_groups(plan_groups(result), dgx, S)
    assert len(scored) == 3 and not any(g.crosses_island or g.crosses_node for g in scored)
