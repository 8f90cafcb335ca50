"""Parser of `nvidia-smi topo -m` text, checked against the machine shapes the fixtures describe."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import hbmserve.placement as placement_pkg
from hbmserve.placement.topo_text import TopoParseError, parse_topo_text
from hbmserve.placement.topology import Link, PathKind, link_from_code

DATA = Path(placement_pkg.__file__).parent / "data"


def _text(name: str) -> str:
    return (DATA / f"{name}.topo.txt").read_text()


def test_dgx_h100_every_pair_is_nv18_and_one_island():
    node = parse_topo_text(_text("dgx_h100"), "dgx")
    assert [g.index for g in node.gpus] == list(range(8))
    for i in range(8):
        for j in range(8):
            expected = Link(PathKind.SELF) if i == j else Link(PathKind.NVLINK, 18)
            assert node.link(i, j) == expected
    assert node.local_islands() == ((0, 1, 2, 3, 4, 5, 6, 7),)


def test_dgx_h100_affinity_columns_and_nics():
    node = parse_topo_text(_text("dgx_h100"), "dgx")
    # Socket 0 holds GPU0-3, socket 1 GPU4-7 (DGX H100: two 56-core CPUs with SMT).
    assert [g.numa_affinity for g in node.gpus] == ["0"] * 4 + ["1"] * 4
    assert node.gpus[0].cpu_affinity == "0-55,112-167"
    assert node.gpus[7].cpu_affinity == "56-111,168-223"
    assert all(g.gpu_numa_id is None for g in node.gpus)  # printed as N/A
    assert [n.label for n in node.nics] == [f"NIC{i}" for i in range(10)]
    assert [n.device for n in node.nics] == [f"mlx5_{i}" for i in range(10)]
    nic0 = node.nics[0]
    assert nic0.gpu_links[0].kind is PathKind.PXB  # the compute NIC under GPU0's switch
    assert nic0.gpu_links[1].kind is PathKind.NODE
    assert nic0.gpu_links[4].kind is PathKind.SYS


def test_l40s_has_no_nvlink_so_every_gpu_is_its_own_island():
    node = parse_topo_text(_text("l40s_8x"), "l40s")
    assert node.local_islands() == tuple((i,) for i in range(8))
    assert node.link(0, 1).kind is PathKind.PIX  # pair under one PCIe switch
    assert node.link(0, 2).kind is PathKind.NODE  # other switch, same socket
    assert node.link(0, 4).kind is PathKind.SYS  # other socket
    assert node.max_nvlinks() == 0
    assert len(node.nics) == 2


def test_nvlink_pairs_from_an_older_driver_without_gpu_numa_column():
    node = parse_topo_text(_text("nvlink_pairs_4x"), "pairs")
    assert node.local_islands() == ((0, 1), (2, 3))
    assert node.link(0, 1) == Link(PathKind.NVLINK, 4)
    assert node.link(1, 2).kind is PathKind.SYS
    assert node.nics == ()
    assert [g.numa_affinity for g in node.gpus] == ["0", "0", "1", "1"]


def test_gb200_tray_reports_gpu_numa_ids():
    node = parse_topo_text(_text("gb200_tray"), "tray")
    assert [g.gpu_numa_id for g in node.gpus] == [2, 10, 18, 26]
    assert node.local_islands() == ((0, 1, 2, 3),)


def test_space_aligned_copy_parses_like_the_tab_original():
    original = _text("l40s_8x")
    spaced = re.sub(r"\t", "   ", original)
    a, b = parse_topo_text(original, "n"), parse_topo_text(spaced, "n")
    assert a.links == b.links
    assert [g.cpu_affinity for g in a.gpus] == [g.cpu_affinity for g in b.gpus]


def test_labels_domain_and_rack_are_carried():
    node = parse_topo_text(_text("gb200_tray"), "t0", labels={"a": "b"}, nvlink_domain="d1", rack="r9")
    assert (dict(node.labels), node.nvlink_domain, node.rack) == ({"a": "b"}, "d1", "r9")


@pytest.mark.parametrize("code,expected", [
    ("NV12", Link(PathKind.NVLINK, 12)), (" X ", Link(PathKind.SELF)), ("PXB", Link(PathKind.PXB)),
    ("PHB", Link(PathKind.PHB)), ("SOC", Link(PathKind.SYS)), ("node", Link(PathKind.NODE)),
])
def test_legend_codes(code, expected):
    assert link_from_code(code) == expected


@pytest.mark.parametrize("code", ["NV", "NET", "NVX", "QPI", "NV0"])
def test_unknown_codes_are_rejected(code):
    with pytest.raises(ValueError):
        link_from_code(code)


SMALL = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t{a}\t0-7\t0\nGPU1\t{b}\t X \t0-7\t0\n"


def test_bad_cell_error_names_row_and_column():
    with pytest.raises(TopoParseError, match=r"row GPU0, column GPU1: unknown topology code 'NVQ'"):
        parse_topo_text(SMALL.format(a="NVQ", b="PIX"), "n")


def test_asymmetric_matrix_is_rejected():
    with pytest.raises(TopoParseError, match="GPU1-GPU0"):
        parse_topo_text(SMALL.format(a="NV2", b="PIX"), "n")


def test_x_off_the_diagonal_is_rejected():
    with pytest.raises(TopoParseError, match="diagonal"):
        parse_topo_text(SMALL.format(a="X", b="X"), "n")


def test_missing_row_is_rejected():
    text = SMALL.format(a="PIX", b="PIX").splitlines()
    with pytest.raises(TopoParseError, match="columns without a row: GPU1"):
        parse_topo_text("\n".join(text[:2]) + "\n", "n")


def test_text_that_is_not_topo_output_is_rejected():
    with pytest.raises(TopoParseError, match="no header line"):
        parse_topo_text("NVIDIA-SMI has failed because it couldn't communicate with the driver", "n")


def test_short_row_is_rejected():
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \t0-7\nGPU1\tPIX\t X \t0-7\n"
    with pytest.raises(TopoParseError):
        parse_topo_text(text, "n")
