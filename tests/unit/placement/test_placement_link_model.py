"""Ring all-reduce link model: T = 2(n-1)*alpha + 2(n-1)/n * S/B over the worst hop."""

from __future__ import annotations

import pytest

from hbmserve.placement.link_model import alpha_us, bandwidth_gbps, point_to_point_us, ring_allreduce
from hbmserve.placement.topology import Link, PathKind

NV18 = Link(PathKind.NVLINK, 18)
NV4 = Link(PathKind.NVLINK, 4)
SYS = Link(PathKind.SYS)
NET = Link(PathKind.NET)
MIB16 = 16 * 1024 * 1024


def test_nvlink_bandwidth_scales_with_link_count():
    # 18 links x 25 GB/s per direction = 450 GB/s: half of H100's 900 GB/s bidirectional.
    assert bandwidth_gbps(NV18) == 450.0
    assert bandwidth_gbps(NV4) == 100.0


def test_eight_gpu_nvswitch_ring_by_hand():
    cost = ring_allreduce([NV18] * 8, MIB16)
    by_hand = 14 * 1.0 + (14 / 8) * MIB16 / 450e9 * 1e6  # 14 steps, 1 us per hop
    assert cost.microseconds == pytest.approx(by_hand)
    assert cost.bottleneck == NV18 and cost.ranks == 8


def test_worst_hop_sets_bandwidth_and_latency():
    cost = ring_allreduce([NV4, SYS, NV4, SYS], MIB16)
    by_hand = 6 * 3.0 + (6 / 4) * MIB16 / 12e9 * 1e6
    assert cost.microseconds == pytest.approx(by_hand)
    assert cost.bottleneck == SYS


def test_crossing_to_the_network_costs_more_than_ten_times_nvlink():
    inside = ring_allreduce([NV18] * 8, MIB16).microseconds
    across = ring_allreduce([NV18] * 6 + [NET] * 2, MIB16).microseconds
    assert across > 10 * inside


def test_single_rank_costs_nothing_and_one_hop_is_invalid():
    assert ring_allreduce([], MIB16).microseconds == 0.0
    with pytest.raises(ValueError):
        ring_allreduce([NV18], MIB16)


def test_self_link_has_no_cost_parameters():
    with pytest.raises(ValueError):
        bandwidth_gbps(Link(PathKind.SELF))
    with pytest.raises(ValueError):
        alpha_us(Link(PathKind.SELF))


def test_point_to_point_by_hand():
    assert point_to_point_us(NET, 25_000_000) == pytest.approx(5.0 + 25e6 / 25e9 * 1e6)
