"""Cluster topology model: GPUs, the links between them, NVLink islands and domains.

Frozen dataclasses only; parsers (`topo_text`, `cluster_file`) and discovery (`nvml_discovery`)
build these, the planner reads them. An *island* is a set of GPUs that can all reach each other
over NVLink: a connected component of the NVLink graph inside one node, or - for nodes that
share an `nvlink_domain` (GB200 NVL72 style) - every GPU of every node in that domain.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field


class PathKind(enum.Enum):
    """How two devices reach each other; the codes are `nvidia-smi topo -m`'s legend."""

    SELF = "X"
    NVLINK = "NV"  # a bonded set of NVLinks; the count lives on the Link
    PIX = "PIX"  # at most one PCIe bridge
    PXB = "PXB"  # several PCIe bridges, no host bridge
    PHB = "PHB"  # through a PCIe host bridge (the CPU)
    NODE = "NODE"  # between PCIe host bridges inside one NUMA node
    SYS = "SYS"  # across the SMP interconnect between NUMA nodes (QPI/UPI/xGMI)
    NET = "NET"  # different machines, no shared NVLink domain: the network


@dataclass(frozen=True)
class Link:
    kind: PathKind
    nvlinks: int = 0  # number of bonded NVLinks when kind is NVLINK

    def __post_init__(self) -> None:
        if (self.kind is PathKind.NVLINK) != (self.nvlinks > 0):
            raise ValueError(f"an NVLink needs a positive link count, got {self.kind} x{self.nvlinks}")

    @property
    def code(self) -> str:
        return f"NV{self.nvlinks}" if self.kind is PathKind.NVLINK else self.kind.value

    @property
    def is_nvlink(self) -> bool:
        return self.kind is PathKind.NVLINK


_NV_CODE = re.compile(r"^NV(\d+)$")
# Older drivers print SOC where current ones print SYS.
_CODE_ALIASES = {"SOC": PathKind.SYS}


def link_from_code(code: str) -> Link:
    """Parse one matrix cell (`NV18`, `PIX`, `X`, ...); ValueError names the bad code."""
    text = code.strip().upper()
    match = _NV_CODE.match(text)
    if match:
        return Link(PathKind.NVLINK, int(match.group(1)))
    if text in _CODE_ALIASES:
        return Link(_CODE_ALIASES[text])
    try:
        kind = PathKind(text)
    except ValueError:
        raise ValueError(f"unknown topology code {code.strip()!r}") from None
    if kind in (PathKind.NVLINK, PathKind.NET):
        raise ValueError(f"unknown topology code {code.strip()!r}")
    return Link(kind)


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str | None = None
    name: str | None = None
    memory_mib: int | None = None
    cpu_affinity: str | None = None  # e.g. "0-55,112-167", as nvidia-smi prints it
    numa_affinity: str | None = None  # NUMA node(s) closest to the GPU, e.g. "0"
    gpu_numa_id: int | None = None  # the GPU's own memory as a NUMA node (Grace Hopper/Blackwell)
    fabric_cluster: str | None = None  # NVLink fabric cluster UUID (multi-node NVLink), from NVML


@dataclass(frozen=True)
class Nic:
    label: str  # column name, e.g. "NIC0"
    device: str | None  # from the NIC legend, e.g. "mlx5_0"
    gpu_links: tuple[Link, ...]  # path from this NIC to each GPU, in GPU order


@dataclass(frozen=True)
class GpuRef:
    node: str
    gpu: int

    def __str__(self) -> str:
        return f"{self.node}:{self.gpu}"


@dataclass(frozen=True)
class NodeTopology:
    name: str
    gpus: tuple[Gpu, ...]
    links: tuple[tuple[Link, ...], ...]  # GPU x GPU, indexed by position in `gpus`
    nics: tuple[Nic, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    nvlink_domain: str | None = None
    rack: str | None = None

    def __post_init__(self) -> None:
        n = len(self.gpus)
        if len(self.links) != n or any(len(row) != n for row in self.links):
            raise ValueError(f"node {self.name}: link matrix must be {n}x{n}")
        for i in range(n):
            if self.links[i][i].kind is not PathKind.SELF:
                raise ValueError(f"node {self.name}: diagonal of the link matrix must be X")
            for j in range(i):
                if self.links[i][j] != self.links[j][i]:
                    raise ValueError(
                        f"node {self.name}: GPU{i}-GPU{j} is {self.links[i][j].code} one way "
                        f"and {self.links[j][i].code} the other"
                    )

    def position(self, gpu_index: int) -> int:
        for pos, gpu in enumerate(self.gpus):
            if gpu.index == gpu_index:
                return pos
        raise KeyError(f"node {self.name} has no GPU {gpu_index}")

    def link(self, a: int, b: int) -> Link:
        """Link between GPU indices `a` and `b` on this node."""
        return self.links[self.position(a)][self.position(b)]

    def local_islands(self) -> tuple[tuple[int, ...], ...]:
        """Connected components of this node's NVLink graph, as sorted GPU indices.

        Ordered by lowest GPU index, so island k of a node is stable across runs; a GPU with no
        NVLink is an island of one.
        """
        n = len(self.gpus)
        parent = list(range(n))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for i in range(n):
            for j in range(i + 1, n):
                if self.links[i][j].is_nvlink:
                    parent[find(i)] = find(j)
        groups: dict[int, list[int]] = {}
        for pos in range(n):
            groups.setdefault(find(pos), []).append(self.gpus[pos].index)
        return tuple(sorted((tuple(sorted(g)) for g in groups.values()), key=lambda g: g[0]))

    def max_nvlinks(self) -> int:
        return max((link.nvlinks for row in self.links for link in row), default=0)


def local_island_id(node: str, k: int) -> str:
    return f"{node}-{k}"


def domain_island_id(domain: str) -> str:
    return f"domain-{domain}"


@dataclass(frozen=True)
class Island:
    id: str
    members: tuple[GpuRef, ...]  # node order as in the cluster, then GPU index
    domain: str | None = None  # set when the island is a multi-node NVLink domain

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m.node for m in self.members))


@dataclass(frozen=True)
class ClusterTopology:
    nodes: tuple[NodeTopology, ...]

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate node names: {', '.join(dupes)}")

    def node(self, name: str) -> NodeTopology:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node named {name!r}")

    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    def islands(self) -> tuple[Island, ...]:
        """Planning islands: node-local NVLink components, with domain nodes merged."""
        result: list[Island] = []
        seen_domains: set[str] = set()
        for node in self.nodes:
            if node.nvlink_domain is None:
                for k, comp in enumerate(node.local_islands()):
                    refs = tuple(GpuRef(node.name, g) for g in comp)
                    result.append(Island(local_island_id(node.name, k), refs))
            elif node.nvlink_domain not in seen_domains:
                seen_domains.add(node.nvlink_domain)
                refs = tuple(
                    GpuRef(member.name, gpu.index)
                    for member in self.nodes
                    if member.nvlink_domain == node.nvlink_domain
                    for gpu in member.gpus
                )
                result.append(Island(domain_island_id(node.nvlink_domain), refs, node.nvlink_domain))
        return tuple(result)

    def island_of(self, ref: GpuRef) -> Island:
        for island in self.islands():
            if ref in island.members:
                return island
        raise KeyError(f"no GPU {ref}")

    def link(self, a: GpuRef, b: GpuRef) -> Link:
        """Link between any two GPUs of the cluster, across nodes too."""
        if a.node == b.node:
            return self.node(a.node).link(a.gpu, b.gpu)
        na, nb = self.node(a.node), self.node(b.node)
        if na.nvlink_domain is not None and na.nvlink_domain == nb.nvlink_domain:
            # Inside a multi-node domain every GPU reaches every other through the NVSwitch
            # fabric at its full per-GPU NVLink width, which the local matrix shows as NV#.
            width = min(na.max_nvlinks(), nb.max_nvlinks()) or 18
            return Link(PathKind.NVLINK, width)
        return Link(PathKind.NET)

    def rack_of(self, node: str) -> str | None:
        return self.node(node).rack
