"""Local link cost model: how long a ring all-reduce takes over a given set of links.

Kept inside placement/ on purpose: the capacity/perf/ performance model is written in parallel and
the planner must not depend on it; when it lands, the planner can take its cost function as a
parameter instead of this one.

Ring all-reduce of S bytes over n ranks takes 2(n-1) steps, each moving S/n bytes over every
hop of the ring at once (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 2009; Thakur et al., "Optimization of collective communication
operations in MPICH", IJHPCA 2005). The slowest hop sets each step's pace:

    T = 2(n-1) * alpha + 2(n-1)/n * S / B

with alpha the per-hop latency and B the per-direction bandwidth of the worst hop. NCCL's own
tuning model has the same shape (src/graph/tuning.cc: latency = base + nsteps * hwLat[link],
time = latency + bytes / busBw).

Parameters (per direction, per GPU; order-of-magnitude values, not measurements):
- NVLink: 25 GB/s per link per direction for NVLink 3 and 4 (NVIDIA A100/H100 datasheets:
  12 links = 600 GB/s and 18 links = 900 GB/s bidirectional), times the NV# count. NVLink 5
  (B200/GB200) doubles the per-link rate; nvidia-smi still prints NV18, so GB200 costs are
  over-estimated twofold - conservative, and equal for every placement compared.
- PCIe Gen4 x16: 32 GB/s per direction on the wire (PCIe 4.0: 16 GT/s x 16 lanes, 128b/130b);
  about 24 GB/s achievable under one switch (PIX/PXB), less through the host bridge (PHB/NODE),
  and around 12 GB/s across sockets (SYS), where P2P is often disabled and NCCL bounces
  through host memory.
- Network: one 200 Gb/s HDR InfiniBand port per GPU = 25 GB/s per direction.
- alpha per hop: NCCL's tuning table lists per-hop ring latencies of roughly 0.5-3.4 us for
  NVLink, 1-5.7 us for PCIe and 2-14 us for the network across versions; we take 1, 2, 3 (SYS)
  and 5 us.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hbmserve.placement.topology import Link, PathKind

NVLINK_GBPS_PER_LINK = 25.0

_BANDWIDTH_GBPS: dict[PathKind, float] = {
    PathKind.PIX: 24.0,
    PathKind.PXB: 24.0,
    PathKind.PHB: 20.0,
    PathKind.NODE: 18.0,
    PathKind.SYS: 12.0,
    PathKind.NET: 25.0,
}

_ALPHA_US: dict[PathKind, float] = {
    PathKind.NVLINK: 1.0,
    PathKind.PIX: 2.0,
    PathKind.PXB: 2.0,
    PathKind.PHB: 2.0,
    PathKind.NODE: 2.0,
    PathKind.SYS: 3.0,
    PathKind.NET: 5.0,
}

# One all-reduce of a 1024-token bf16 activation for hidden size 8192 (a 70B-class model's
# prefill chunk): 1024 * 8192 * 2 bytes.
DEFAULT_ALLREDUCE_BYTES = 16 * 1024 * 1024


def bandwidth_gbps(link: Link) -> float:
    if link.kind is PathKind.SELF:
        raise ValueError("a GPU has no link to itself")
    if link.kind is PathKind.NVLINK:
        return NVLINK_GBPS_PER_LINK * link.nvlinks
    return _BANDWIDTH_GBPS[link.kind]


def alpha_us(link: Link) -> float:
    if link.kind is PathKind.SELF:
        raise ValueError("a GPU has no link to itself")
    return _ALPHA_US[link.kind]


@dataclass(frozen=True)
class RingCost:
    ranks: int
    bottleneck: Link | None  # None for a single rank, which needs no communication
    microseconds: float


def ring_allreduce(hops: Sequence[Link], message_bytes: int) -> RingCost:
    """Cost of a ring all-reduce whose consecutive hops (including the wrap-around) are `hops`.

    For n ranks pass n hops; a single rank passes none and costs nothing.
    """
    n = len(hops)
    if n == 0:
        return RingCost(1, None, 0.0)
    if n == 1:
        raise ValueError("a ring of two or more ranks has as many hops as ranks")
    worst = min(hops, key=bandwidth_gbps)
    alpha = max(alpha_us(h) for h in hops)
    steps = 2 * (n - 1)
    seconds_per_byte = 1.0 / (bandwidth_gbps(worst) * 1e9)
    transfer_us = steps / n * message_bytes * seconds_per_byte * 1e6
    return RingCost(n, worst, steps * alpha + transfer_us)


def point_to_point_us(link: Link, message_bytes: int) -> float:
    """One send of `message_bytes` over `link` (pipeline stage hand-off)."""
    return alpha_us(link) + message_bytes / (bandwidth_gbps(link) * 1e9) * 1e6
