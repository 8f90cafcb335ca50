"""Node bootstrap: topology -> Ray node labels and custom resources."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

import hbmserve.placement as placement_pkg
from hbmserve.placement.bootstrap import bootstrap_node, island_index_of, label_value
from hbmserve.placement.cluster_file import load_cluster_file
from hbmserve.placement.topo_text import parse_topo_text

DATA = Path(placement_pkg.__file__).parent / "data"


def test_pairs_box_gets_one_resource_per_island():
    node = load_cluster_file(DATA / "cluster_nvlink_pairs_x2.yaml").node("pairs-b")
    spec = bootstrap_node(node)
    assert dict(spec.resources) == {"nvlink_island:pairs-b-0": 2.0, "nvlink_island:pairs-b-1": 2.0}
    assert dict(spec.labels) == {
        "rack": "r3",  # the node's own label from the cluster file
        "hbmserve.io/node": "pairs-b",
        "hbmserve.io/rack": "r3",
        "hbmserve.io/gpus": "4",
        "hbmserve.io/largest-nvlink-island": "2",
    }


def test_l40s_has_eight_single_gpu_islands():
    node = load_cluster_file(DATA / "cluster_l40s_x2.yaml").node("l40s-a")
    spec = bootstrap_node(node)
    assert dict(spec.resources) == {f"nvlink_island:l40s-a-{k}": 1.0 for k in range(8)}
    assert spec.labels["hbmserve.io/largest-nvlink-island"] == "1"


def test_domain_tray_gets_domain_resource_and_label():
    node = load_cluster_file(DATA / "cluster_nvl72.yaml").node("gb200-t05")
    spec = bootstrap_node(node)
    assert dict(spec.resources) == {"nvlink_island:gb200-t05-0": 4.0, "nvlink_domain:nvl72-a": 4.0}
    assert spec.labels["hbmserve.io/nvlink-domain"] == "nvl72-a"


def test_ray_start_arguments_round_trip_through_a_shell():
    node = load_cluster_file(DATA / "cluster_nvl72.yaml").node("gb200-t00")
    spec = bootstrap_node(node)
    args = shlex.split(spec.shell())
    assert args[0] == "--labels" and args[2] == "--resources"
    assert dict(pair.split("=") for pair in args[1].split(",")) == dict(spec.labels)
    assert json.loads(args[3]) == dict(spec.resources)
    assert spec.to_json_dict()["ray_start_args"] == args


@pytest.mark.parametrize("raw,expected", [
    ("dgx-a", "dgx-a"), ("host.example.com", "host.example.com"), ("node 7/rack:2", "node-7-rack-2"),
    ("-edge_", "edge"), ("x" * 80, "x" * 63),
])
def test_label_values_follow_kubernetes_syntax(raw, expected):
    assert label_value(raw) == expected


def test_label_value_of_nothing_is_an_error():
    with pytest.raises(ValueError):
        label_value("///")


def test_reserved_or_invalid_label_keys_are_rejected():
    text = (DATA / "nvlink_pairs_4x.topo.txt").read_text()
    for key in ("ray.io/node-id", "bad key"):
        with pytest.raises(ValueError, match="label key"):
            bootstrap_node(parse_topo_text(text, "n", labels={key: "v"}))


def test_island_index_of():
    node = parse_topo_text((DATA / "nvlink_pairs_4x.topo.txt").read_text(), "n")
    assert [island_index_of(node, g) for g in range(4)] == [0, 0, 1, 1]
    with pytest.raises(KeyError):
        island_index_of(node, 9)
