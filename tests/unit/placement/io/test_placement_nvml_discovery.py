"""NVML discovery adapter, driven by a fake NVML built from real machine shapes (parsed
`nvidia-smi topo -m` of a DGX H100, an NVLink-bridged workstation and a GB200 tray), plus the
same discovery on real hardware when this machine has a GPU."""

from __future__ import annotations

import ctypes
import uuid as uuid_mod
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest

import hbmserve.placement as placement_pkg
from hbmserve.placement.io.nvml_discovery import discover_node
from hbmserve.placement.topo_text import parse_topo_text
from hbmserve.placement.topology import Link, NodeTopology, PathKind

DATA = Path(placement_pkg.__file__).parent / "data"
_LEVEL = {PathKind.PIX: 10, PathKind.PXB: 20, PathKind.PHB: 30, PathKind.NODE: 40, PathKind.SYS: 50}


def _members(text: str | None) -> list[int]:
    out: list[int] = []
    for part in (text or "").split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _mask(members: list[int], words: int) -> list[int]:
    masks = [0] * words
    for m in members:
        if m < 64 * words:  # NVML fills only the words it is given
            masks[m // 64] |= 1 << (m % 64)
    return masks


class FakeNvml:
    """Answers pynvml's queries from a parsed topology; NVSwitch boxes wire every link to a switch."""

    NVMLError = pynvml.NVMLError
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_NVLINK_DEVICE_TYPE_GPU = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
    NVML_NVLINK_DEVICE_TYPE_SWITCH = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    NVML_P2P_CAPS_INDEX_NVLINK = pynvml.NVML_P2P_CAPS_INDEX_NVLINK
    NVML_P2P_STATUS_OK = pynvml.NVML_P2P_STATUS_OK
    NVML_AFFINITY_SCOPE_NODE = pynvml.NVML_AFFINITY_SCOPE_NODE
    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_GPU_FABRIC_STATE_COMPLETED = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    c_nvmlGpuFabricInfoV_t = pynvml.c_nvmlGpuFabricInfoV_t

    def __init__(self, node: NodeTopology, switched: bool, fabric: uuid_mod.UUID | None = None,
                 down: frozenset[tuple[int, int]] = frozenset(), no_p2p: frozenset[tuple[int, int]] = frozenset()):
        self.node, self.fabric, self.down, self.no_p2p = node, fabric, down, no_p2p
        self.initialised = 0
        n = len(node.gpus)
        # links[i] = list of (remote bus id, remote type)
        self.links: list[list[tuple[str, int]]] = [[] for _ in range(n)]
        for i in range(n):
            if switched:
                count = max(node.links[i][j].nvlinks for j in range(n))
                self.links[i] = [(f"00000000:{0xE0 + k % 4:02X}:00.0", self.NVML_NVLINK_DEVICE_TYPE_SWITCH)
                                 for k in range(count)]
            else:
                for j in range(n):
                    self.links[i] += [(self._bus(j), self.NVML_NVLINK_DEVICE_TYPE_GPU)] * node.links[i][j].nvlinks

    @staticmethod
    def _bus(i: int) -> str:
        return f"00000000:{0x18 + 0x10 * i:02X}:00.0"

    def nvmlInit(self): self.initialised += 1
    def nvmlShutdown(self): self.initialised -= 1
    def nvmlDeviceGetCount(self): return len(self.node.gpus)
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetPciInfo(self, h): return SimpleNamespace(busId=self._bus(h).encode())
    def nvmlDeviceGetUUID(self, h): return f"GPU-{h:08x}-0000-0000-0000-000000000000"
    def nvmlDeviceGetName(self, h): return b"NVIDIA H100 80GB HBM3"
    def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(total=80 * 1024**3)

    def nvmlDeviceGetCpuAffinity(self, h, words):
        return _mask(_members(self.node.gpus[h].cpu_affinity), words)

    def nvmlDeviceGetMemoryAffinity(self, h, words, scope):
        return _mask(_members(self.node.gpus[h].numa_affinity), words)

    def nvmlDeviceGetNumaNodeId(self, h):
        if self.node.gpus[h].gpu_numa_id is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.node.gpus[h].gpu_numa_id

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link >= len(self.links[h]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if (h, link) in self.down else self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link): return SimpleNamespace(busId=self.links[h][link][0])
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link): return self.links[h][link][1]

    def nvmlDeviceGetP2PStatus(self, a, b, index):
        return 4 if (min(a, b), max(a, b)) in self.no_p2p else self.NVML_P2P_STATUS_OK

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        link = self.node.links[a][b]
        if link.is_nvlink:  # the text hides the PCIe path behind NV#; use the sockets instead
            same = self.node.gpus[a].numa_affinity == self.node.gpus[b].numa_affinity
            return _LEVEL[PathKind.NODE if same else PathKind.SYS]
        return _LEVEL[link.kind]

    def nvmlDeviceGetGpuFabricInfoV(self, h, ref):
        if self.fabric is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = ref._obj
        ctypes.memmove(info.clusterUuid, self.fabric.bytes, 16)
        info.state, info.status, info.cliqueId = self.NVML_GPU_FABRIC_STATE_COMPLETED, self.NVML_SUCCESS, 1
        return self.NVML_SUCCESS


def _parsed(name: str) -> NodeTopology:
    return parse_topo_text((DATA / f"{name}.topo.txt").read_text(), name)


def test_dgx_h100_through_nvswitch_reads_nv18_everywhere():
    shape = _parsed("dgx_h100")
    fake = FakeNvml(shape, switched=True)
    found = discover_node("dgx", nvml=fake, cpu_count=224)
    assert found.node.links == shape.links
    assert found.node.local_islands() == ((0, 1, 2, 3, 4, 5, 6, 7),)
    assert [g.cpu_affinity for g in found.node.gpus] == [g.cpu_affinity for g in shape.gpus]
    assert [g.numa_affinity for g in found.node.gpus] == ["0"] * 4 + ["1"] * 4
    gpu = found.node.gpus[3]
    assert (gpu.uuid, gpu.name, gpu.memory_mib) == ("GPU-00000003-0000-0000-0000-000000000000",
                                                    "NVIDIA H100 80GB HBM3", 81920)
    assert found.node.nvlink_domain is None and found.dropped_links == ()
    assert all(ok for i, row in enumerate(found.nvlink_p2p_ok) for j, ok in enumerate(row) if i != j)
    assert fake.initialised == 0  # nvmlShutdown ran


def test_bridged_pairs_read_peer_links_and_pcie_paths():
    shape = _parsed("nvlink_pairs_4x")
    found = discover_node("pairs", nvml=FakeNvml(shape, switched=False), cpu_count=128)
    assert found.node.links == shape.links  # NV4 inside a pair, SYS across sockets
    assert found.pci_bus_ids[1] == "0000:28:00.0"


def test_gb200_fabric_cluster_becomes_the_nvlink_domain():
    shape = _parsed("gb200_tray")
    fabric = uuid_mod.UUID("12345678-1234-5678-1234-567812345678")
    found = discover_node("tray", nvml=FakeNvml(shape, switched=True, fabric=fabric), cpu_count=144)
    assert found.node.nvlink_domain == str(fabric)
    assert [g.fabric_cluster for g in found.node.gpus] == [str(fabric)] * 4
    assert [g.gpu_numa_id for g in found.node.gpus] == [2, 10, 18, 26]
    explicit = discover_node("tray", nvlink_domain="nvl72-a", nvml=FakeNvml(shape, True, fabric), cpu_count=144)
    assert explicit.node.nvlink_domain == "nvl72-a"


def test_a_link_down_lowers_the_count():
    shape = _parsed("nvlink_pairs_4x")
    found = discover_node("pairs", nvml=FakeNvml(shape, False, down=frozenset({(0, 0), (1, 0)})), cpu_count=128)
    assert found.node.link(0, 1) == Link(PathKind.NVLINK, 3)
    assert found.inactive_nvlinks == (1, 1, 0, 0)


def test_nvlink_without_p2p_is_not_an_island():
    shape = _parsed("nvlink_pairs_4x")
    found = discover_node("pairs", nvml=FakeNvml(shape, False, no_p2p=frozenset({(0, 1)})), cpu_count=128)
    assert found.dropped_links == ((0, 1),)
    assert found.node.link(0, 1) == Link(PathKind.NODE)  # falls back to the PCIe path
    assert found.node.local_islands() == ((0,), (1,), (2, 3))


def _real_nvml_or_skip():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pytest.skip("no GPU")
    count = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    if count == 0:
        pytest.skip("no GPU")
    return count


def test_discovery_on_real_hardware():
    count = _real_nvml_or_skip()
    found = discover_node("local")
    assert len(found.node.gpus) == count
    assert all(g.uuid and g.uuid.startswith(("GPU-", "MIG-")) for g in found.node.gpus)
    assert all(g.memory_mib and g.memory_mib > 1024 for g in found.node.gpus)
    islands = found.node.local_islands()
    assert sorted(g for island in islands for g in island) == list(range(count))
