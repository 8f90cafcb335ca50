"""NVML discovery adapter: asks the driver (through nvidia-ml-py) what this node looks like.

Thin on purpose: it reads, it does not decide. `pynvml` is imported lazily so the package, its
tests and `hbmserve --help` work on machines without the NVIDIA driver; callers may pass any
object with pynvml's function names (tests use one built from parsed `nvidia-smi topo -m`).

What it reads per GPU: index, UUID, name, memory, PCI bus id, CPU and NUMA affinity, GPU NUMA id,
NVLink fabric cluster (GB200 NVL72 domains span nodes). Per NVLink: state and remote device
(a GPU, or an NVSwitch). Per GPU pair: PCIe common ancestor and P2P status over NVLink.
"""

from __future__ import annotations

import importlib
import uuid as uuid_mod
from ctypes import byref
from dataclasses import dataclass
from typing import Any

from hbmserve.placement.topology import Gpu, Link, NodeTopology, PathKind

# nvmlDeviceGetTopologyCommonAncestor levels -> nvidia-smi codes. INTERNAL means two GPUs on
# one board, which is at most a single bridge apart.
_ANCESTOR_TO_KIND = {0: PathKind.PIX, 10: PathKind.PIX, 20: PathKind.PXB, 30: PathKind.PHB,
                     40: PathKind.NODE, 50: PathKind.SYS}


@dataclass(frozen=True)
class NvmlDiscovery:
    node: NodeTopology
    pci_bus_ids: tuple[str, ...]  # per GPU position
    nvlink_p2p_ok: tuple[tuple[bool | None, ...], ...]  # None: not asked (no NVLink or unsupported)
    inactive_nvlinks: tuple[int, ...]  # per GPU: links that exist but are down
    dropped_links: tuple[tuple[int, int], ...]  # NVLink pairs ignored because P2P over them failed


def load_pynvml() -> Any:
    """Import nvidia-ml-py's `pynvml`; ImportError tells the caller the package is missing."""
    return importlib.import_module("pynvml")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bus_id(value: bytes | str) -> str:
    domain, bus, devfn = _text(value).strip().lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{devfn}"


def _ranges(bits: list[int]) -> str | None:
    if not bits:
        return None
    spans: list[str] = []
    start = prev = bits[0]
    for b in bits[1:] + [None]:  # type: ignore[list-item]
        if b is not None and b == prev + 1:
            prev = b
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if b is not None:
            start = prev = b
    return ",".join(spans)


def _bitmask_members(words: Any) -> list[int]:
    return [w * 64 + bit for w, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1]


class _Reader:
    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml

    def optional(self, fn: str, *args: Any) -> Any:
        """Call an NVML query that older drivers or GPUs may not support; None when they don't."""
        func = getattr(self.nvml, fn, None)
        if func is None:
            return None
        try:
            return func(*args)
        except self.nvml.NVMLError:
            return None

    def fabric_cluster(self, handle: Any) -> str | None:
        struct_cls = getattr(self.nvml, "c_nvmlGpuFabricInfoV_t", None)
        if struct_cls is None:
            return None
        info = struct_cls()
        if self.optional("nvmlDeviceGetGpuFabricInfoV", handle, byref(info)) is None:
            return None
        if info.state != self.nvml.NVML_GPU_FABRIC_STATE_COMPLETED or info.status != self.nvml.NVML_SUCCESS:
            return None
        raw = bytes(info.clusterUuid)
        if not any(raw):
            return None
        return str(uuid_mod.UUID(bytes=raw))

    def nvlinks(self, handle: Any, bus_to_pos: dict[str, int]) -> tuple[dict[int, int], int, int]:
        """Active links per peer GPU position, active links to NVSwitches, links that are down."""
        nvml = self.nvml
        peers: dict[int, int] = {}
        to_switch = down = 0
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            state = self.optional("nvmlDeviceGetNvLinkState", handle, link)
            if state is None:
                continue
            if state != nvml.NVML_FEATURE_ENABLED:
                down += 1
                continue
            remote = self.optional("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            peer = None if remote is None else bus_to_pos.get(_bus_id(remote.busId))
            kind = self.optional("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
            if peer is not None and kind in (None, nvml.NVML_NVLINK_DEVICE_TYPE_GPU):
                peers[peer] = peers.get(peer, 0) + 1
            else:
                to_switch += 1
        return peers, to_switch, down


def discover_node(
    name: str,
    labels: dict[str, str] | None = None,
    nvlink_domain: str | None = None,
    rack: str | None = None,
    nvml: Any | None = None,
    cpu_count: int = 1024,
) -> NvmlDiscovery:
    """Read this node's GPUs and links through NVML. Raises the NVML error if NVML cannot start.

    `nvlink_domain` overrides the fabric cluster NVML reports; without either, the node is its
    own NVLink world. `cpu_count` sizes the affinity bitmasks.
    """
    nvml = nvml if nvml is not None else load_pynvml()
    read = _Reader(nvml)
    nvml.nvmlInit()
    try:
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        buses = tuple(_bus_id(nvml.nvmlDeviceGetPciInfo(h).busId) for h in handles)
        bus_to_pos = {bus: pos for pos, bus in enumerate(buses)}
        words = max(1, (cpu_count + 63) // 64)
        gpus, fabrics, peer_links, switch_links, down = [], [], [], [], []
        for i, h in enumerate(handles):
            cpus = read.optional("nvmlDeviceGetCpuAffinity", h, words)
            mems = read.optional("nvmlDeviceGetMemoryAffinity", h, 1, nvml.NVML_AFFINITY_SCOPE_NODE)
            fabric = read.fabric_cluster(h)
            memory = read.optional("nvmlDeviceGetMemoryInfo", h)
            gpus.append(Gpu(
                index=i,
                uuid=_text(nvml.nvmlDeviceGetUUID(h)),
                name=_text(nvml.nvmlDeviceGetName(h)),
                memory_mib=None if memory is None else int(memory.total) // (1024 * 1024),
                cpu_affinity=None if cpus is None else _ranges(_bitmask_members(cpus)),
                numa_affinity=None if mems is None else _ranges(_bitmask_members(mems)),
                gpu_numa_id=read.optional("nvmlDeviceGetNumaNodeId", h),
                fabric_cluster=fabric,
            ))
            fabrics.append(fabric)
            peers, to_switch, inactive = read.nvlinks(h, bus_to_pos)
            peer_links.append(peers)
            switch_links.append(to_switch)
            down.append(inactive)

        links: list[list[Link]] = []
        p2p: list[list[bool | None]] = []
        dropped: list[tuple[int, int]] = []
        for i in range(count):
            row, p2p_row = [], []
            for j in range(count):
                if i == j:
                    row.append(Link(PathKind.SELF))
                    p2p_row.append(None)
                    continue
                direct = max(peer_links[i].get(j, 0), peer_links[j].get(i, 0))
                # Through NVSwitch every pair gets the narrower GPU's full link count; this is
                # what nvidia-smi prints as NV18 between all pairs of an HGX H100 board.
                switched = min(switch_links[i], switch_links[j])
                nvlinks = direct + switched
                ok = None
                if nvlinks:
                    status = read.optional("nvmlDeviceGetP2PStatus", handles[i], handles[j],
                                           nvml.NVML_P2P_CAPS_INDEX_NVLINK)
                    ok = None if status is None else status == nvml.NVML_P2P_STATUS_OK
                p2p_row.append(ok)
                if nvlinks and ok is not False:
                    row.append(Link(PathKind.NVLINK, nvlinks))
                    continue
                if nvlinks and i < j:
                    dropped.append((i, j))
                level = read.optional("nvmlDeviceGetTopologyCommonAncestor", handles[i], handles[j])
                row.append(Link(_ANCESTOR_TO_KIND.get(level, PathKind.SYS)))
            links.append(row)
            p2p.append(p2p_row)
    finally:
        nvml.nvmlShutdown()

    shared = set(fabrics)
    domain = nvlink_domain or (fabrics[0] if len(shared) == 1 and fabrics and fabrics[0] else None)
    node = NodeTopology(
        name=name,
        gpus=tuple(gpus),
        links=tuple(tuple(r) for r in links),
        labels=dict(labels or {}),
        nvlink_domain=domain,
        rack=rack,
    )
    return NvmlDiscovery(
        node=node,
        pci_bus_ids=buses,
        nvlink_p2p_ok=tuple(tuple(r) for r in p2p),
        inactive_nvlinks=tuple(down),
        dropped_links=tuple(dropped),
    )
