"""Cluster files: the issue's YAML/JSON format, multi-node NVLink domains, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import hbmserve.placement as placement_pkg
from hbmserve.placement.cluster_file import TopologyFileError, load_cluster_file, parse_cluster_text
from hbmserve.placement.topology import GpuRef, Link, PathKind

DATA = Path(placement_pkg.__file__).parent / "data"
PAIRS = (DATA / "nvlink_pairs_4x.topo.txt").read_text()
TRAY = (DATA / "gb200_tray.topo.txt").read_text()


def _node(name, topo, domain=None, labels=None):
    return {"name": name, "labels": labels or {}, "nvlink_domain": domain, "nvidia_smi_topo": topo}


def test_json_in_the_issue_format(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"nodes": [_node("a", PAIRS, labels={"rack": "r1"}), _node("b", PAIRS)]}))
    cluster = load_cluster_file(path)
    assert [n.name for n in cluster.nodes] == ["a", "b"]
    assert cluster.node("a").rack == "r1"  # rack comes from the `rack` label
    assert cluster.node("b").rack is None
    assert [(i.id, i.size) for i in cluster.islands()] == [("a-0", 2), ("a-1", 2), ("b-0", 2), ("b-1", 2)]


def test_yaml_in_the_issue_format(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"nodes": [_node("w1", PAIRS)]}))
    assert load_cluster_file(path).node("w1").local_islands() == ((0, 1), (2, 3))


def test_nodes_sharing_a_domain_form_one_island():
    data = {"nodes": [_node(f"t{i}", TRAY, "nvl-a") for i in range(3)] + [_node("solo", TRAY)]}
    cluster = parse_cluster_text(json.dumps(data))
    islands = {i.id: i for i in cluster.islands()}
    assert set(islands) == {"domain-nvl-a", "solo-0"}
    domain = islands["domain-nvl-a"]
    assert domain.size == 12 and domain.nodes == ("t0", "t1", "t2") and domain.domain == "nvl-a"
    # Across trays of one domain the path is NVLink at the tray's width; outside it, the network.
    assert cluster.link(GpuRef("t0", 0), GpuRef("t2", 3)) == Link(PathKind.NVLINK, 18)
    assert cluster.link(GpuRef("t0", 0), GpuRef("solo", 0)) == Link(PathKind.NET)


def test_fixture_files_load():
    sizes = {
        "cluster_dgx_h100_x2.yaml": [8, 8],
        "cluster_l40s_x2.yaml": [1] * 16,
        "cluster_nvlink_pairs_x2.yaml": [2, 2, 2, 2],
        "cluster_nvl72.yaml": [72],
        "cluster_mixed_racks.json": [8, 2, 2] + [1] * 8 + [8, 2, 2],
    }
    for name, expected in sizes.items():
        assert [i.size for i in load_cluster_file(DATA / name).islands()] == expected, name


def test_mixed_racks_fixture_has_two_racks():
    cluster = load_cluster_file(DATA / "cluster_mixed_racks.json")
    assert {n.name: n.rack for n in cluster.nodes} == {
        "dgx-a1": "rack-a", "pairs-a2": "rack-a", "l40s-b1": "rack-b", "dgx-b2": "rack-b", "pairs-b3": "rack-b"}


def test_explicit_rack_key_wins_over_label():
    data = {"nodes": [dict(_node("a", PAIRS, labels={"rack": "r1"}), rack="r7")]}
    assert parse_cluster_text(json.dumps(data)).node("a").rack == "r7"


def test_bare_topo_text_is_a_one_node_cluster(tmp_path):
    path = tmp_path / "box7.txt"
    path.write_text(PAIRS)
    cluster = load_cluster_file(path)
    assert [n.name for n in cluster.nodes] == ["box7"]


@pytest.mark.parametrize("data,field", [
    ({"nodes": []}, "nodes"),
    ({"nodes": [{"name": "a", "nvidia_smi_topo": PAIRS, "colour": "red"}]}, "nodes.0.colour"),
    ({"nodes": [{"name": "a"}]}, "nodes.0.nvidia_smi_topo"),
    ({"nodes": [{"name": "a", "nvidia_smi_topo": PAIRS, "labels": {"k": 3}}]}, "nodes.0.labels.k"),
    ({"nodes": [_node("a", PAIRS)], "extra": 1}, "unknown top-level keys"),
])
def test_validation_errors_name_the_field(data, field):
    with pytest.raises(TopologyFileError) as info:
        parse_cluster_text(json.dumps(data), source="c.json")
    assert field in str(info.value) and str(info.value).startswith("c.json")


def test_broken_topology_text_names_the_node():
    data = {"nodes": [_node("a", PAIRS), _node("b", "hello")]}
    with pytest.raises(TopologyFileError, match=r"nodes\.1\.nvidia_smi_topo \(b\)"):
        parse_cluster_text(json.dumps(data))


def test_duplicate_node_names_are_rejected():
    with pytest.raises(TopologyFileError, match="duplicate node names: a"):
        parse_cluster_text(json.dumps({"nodes": [_node("a", PAIRS), _node("a", PAIRS)]}))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(TopologyFileError, match="cannot read"):
        load_cluster_file(tmp_path / "nope.yaml")


def test_invalid_json_is_a_clear_error():
    with pytest.raises(TopologyFileError, match="invalid JSON"):
        parse_cluster_text('{"nodes": [', source="x.json")
