"""PlacementPlan -> placement-group specs (pure part of the Ray adapter; no Ray started)."""

from __future__ import annotations

from pathlib import Path

import pytest

import hbmserve.placement as placement_pkg
from hbmserve.placement.cluster_file import load_cluster_file
from hbmserve.placement.placement_types import PlacementRequest
from hbmserve.placement.placer import plan
from hbmserve.placement.io.ray_adapter import placement_group_specs

DATA = Path(placement_pkg.__file__).parent / "data"


def _specs(cluster_file, request, **kwargs):
    cluster = load_cluster_file(DATA / cluster_file)
    return placement_group_specs(plan(request, cluster), cluster, **kwargs)


def test_one_gpu_per_bundle_pinned_to_its_island():
    specs = _specs("cluster_nvlink_pairs_x2.yaml", PlacementRequest(tp=2, replicas=3))
    assert [s.name for s in specs] == ["hbmserve-r0", "hbmserve-r1", "hbmserve-r2"]
    assert specs[2].bundle_dicts() == [
        {"GPU": 1.0, "nvlink_island:pairs-a-1": 1.0},
        {"GPU": 1.0, "nvlink_island:pairs-a-1": 1.0},
    ]
    assert specs[1].bundle_label_selector() == [{"hbmserve.io/node": "pairs-b"}] * 2
    assert all(s.strategy == "STRICT_PACK" for s in specs)


def test_multi_node_replica_uses_pack_and_rank_order():
    (spec,) = _specs("cluster_dgx_h100_x2.yaml", PlacementRequest(tp=4, pp=3))
    # 3 stages of 4: stage 0 and 1 fill dgx-a (same node first), stage 2 goes to dgx-b.
    assert [b.node for b in spec.bundles] == ["dgx-a"] * 8 + ["dgx-b"] * 4
    assert [b.rank for b in spec.bundles] == list(range(12))
    assert spec.strategy == "PACK"
    assert spec.bundle_indices == ",".join(str(i) for i in range(12))
    assert spec.vllm_env() == {"VLLM_RAY_BUNDLE_INDICES": spec.bundle_indices}
    assert spec.bundle_for_rank(9) == 9


def test_cpus_go_to_every_bundle_and_replica_cpus_to_bundle_zero():
    (spec,) = _specs("cluster_nvlink_pairs_x2.yaml", PlacementRequest(tp=2), cpus_per_bundle=0.5, replica_cpus=1.0)
    assert [b["CPU"] for b in spec.bundle_dicts()] == [1.5, 0.5]


def test_serve_options_carry_bundles_strategy_and_selectors():
    (spec,) = _specs("cluster_nvl72.yaml", PlacementRequest(tp=8))
    options = spec.serve_options()
    assert options["placement_group_strategy"] == "PACK"
    assert len(options["placement_group_bundles"]) == 8
    # The TP=8 group spans two trays of the domain; each bundle names its tray's island.
    assert {tuple(sorted(b)) for b in options["placement_group_bundles"]} == {
        ("GPU", "nvlink_island:gb200-t00-0"), ("GPU", "nvlink_island:gb200-t01-0")}
    assert [s["hbmserve.io/node"] for s in options["placement_group_bundle_label_selector"]] == (
        ["gb200-t00"] * 4 + ["gb200-t01"] * 4)


def test_several_gpus_per_rank_have_no_vllm_bundle_order():
    (spec,) = _specs("cluster_dgx_h100_x2.yaml", PlacementRequest(tp=2, gpus_per_rank=2))
    assert [b.rank for b in spec.bundles] == [0, 0, 1, 1]
    assert spec.bundle_indices is None and spec.vllm_env() == {}


def test_infeasible_plan_has_no_placement_groups():
    cluster = load_cluster_file(DATA / "cluster_nvlink_pairs_x2.yaml")
    with pytest.raises(ValueError, match="infeasible"):
        placement_group_specs(plan(PlacementRequest(tp=8), cluster), cluster)
