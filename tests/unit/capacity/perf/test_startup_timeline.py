"""The start-up timeline model (capacity/perf/startup_timeline.py): hand-worked at the issue's sizes,
and properties every input must keep."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.capacity.perf.startup_timeline import (Phase, StartKind, StartupInputs, ratios, startup_s,
                                                timeline)
from hbmserve.core.scaling import Tier

# Llama-3.1-70B in bf16 over 25 Gb/s, NVMe at 3 GB/s, TP=4 waking over a 40 GB/s host link.
REF = StartupInputs(weights_bytes=140e9, source_gbps=25 / 8, disk_gbps=3.0, load_efficiency=0.92,
                    node_ready_s=120.0, engine_init_s=30.0, promote_s=0.5, first_token_s=0.1,
                    wake_gbps=40.0, devices=4, wake_fixed_s=1.0)


def test_cold_start_of_70b_phase_by_phase():
    t = timeline(StartKind.COLD, REF)
    assert [p for p, _ in t.phases] == [Phase.NODE_READY, Phase.WEIGHTS_LOCAL, Phase.ENGINE_LOADED,
                                        Phase.FIRST_TOKEN]
    assert t.seconds(Phase.WEIGHTS_LOCAL) == pytest.approx(140 / 3.125)  # 44.8 s on the wire
    assert t.seconds(Phase.ENGINE_LOADED) == pytest.approx(140 / (3 * 0.92) + 30)  # 80.7 s
    assert t.first_token_s == pytest.approx(120 + 44.8 + 140 / 2.76 + 30 + 0.1)
    assert t.serving_s == pytest.approx(t.first_token_s - 0.1)


def test_warm_skips_the_node_and_the_fetch():
    t = timeline(StartKind.WARM, REF)
    assert [p for p, _ in t.phases] == [Phase.ENGINE_LOADED, Phase.FIRST_TOKEN]
    assert t.first_token_s == pytest.approx(140 / 2.76 + 30 + 0.1)


def test_hot_is_promotion_and_a_token_and_sleeping_adds_the_wake():
    assert timeline(StartKind.HOT, REF).first_token_s == pytest.approx(0.6)
    sleeping = timeline(StartKind.SLEEPING, REF)
    # Each of the 4 devices copies its 35 GB shard back at 40 GB/s, then 1 s of fixed wake.
    assert sleeping.seconds(Phase.ENGINE_LOADED) == pytest.approx(35 / 40 + 1.0)
    assert sleeping.first_token_s == pytest.approx(35 / 40 + 1.0 + 0.6)


def test_ratios_against_the_targets():
    r = ratios(REF)
    cold = 120 + 44.8 + 140 / 2.76 + 30 + 0.1
    assert r.warm == pytest.approx((140 / 2.76 + 30.1) / cold) and r.warm_met  # 0.33
    assert r.hot == pytest.approx(0.6 / cold) and r.hot_met
    assert r.sleeping_met is True
    # Without node provisioning (the node up, its cache empty) the warm target is missed.
    r0 = ratios(dataclasses.replace(REF, node_ready_s=0.0))
    assert r0.warm == pytest.approx((140 / 2.76 + 30.1) / (44.8 + 140 / 2.76 + 30.1)) and not r0.warm_met


def test_an_engine_without_sleep_mode_cannot_wake():
    cpu = dataclasses.replace(REF, wake_gbps=None)
    with pytest.raises(ValueError, match="no sleep mode"):
        timeline(StartKind.SLEEPING, cpu)
    assert ratios(cpu).sleeping is None and ratios(cpu).sleeping_met is None


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="disk_gbps must be > 0"):
        dataclasses.replace(REF, disk_gbps=0.0)
    with pytest.raises(ValueError, match="node_ready_s must be >= 0"):
        dataclasses.replace(REF, node_ready_s=-1.0)


positive = st.floats(0.01, 1e3)
seconds = st.floats(0.0, 600.0)
inputs = st.builds(StartupInputs, weights_bytes=st.floats(0.0, 1e12), source_gbps=positive,
                   disk_gbps=positive, load_efficiency=st.floats(0.1, 1.5), node_ready_s=seconds,
                   engine_init_s=seconds, promote_s=seconds, first_token_s=seconds,
                   wake_gbps=st.none() | positive, devices=st.integers(1, 16), wake_fixed_s=seconds)


@settings(max_examples=200, deadline=None)
@given(inputs, st.booleans())
def test_policy_start_ups_are_ordered_and_accepted_by_the_policy(i, sleeping):
    sleeping = sleeping and i.has_sleep_mode
    s = startup_s(i, sleeping=sleeping)
    assert s[Tier.HOT] <= s[Tier.WARM] <= s[Tier.COLD]
    AutoscaleConfig(startup_hot_s=s[Tier.HOT], startup_warm_s=s[Tier.WARM], startup_cold_s=s[Tier.COLD])
    # A cold start contains a warm one: node and fetch come on top.
    assert s[Tier.COLD] == pytest.approx(s[Tier.WARM] + i.node_ready_s + i.fetch_s())


@settings(max_examples=200, deadline=None)
@given(inputs, st.floats(1.01, 10.0))
def test_more_bandwidth_is_never_slower(i, k):
    faster = dataclasses.replace(i, source_gbps=i.source_gbps * k, disk_gbps=i.disk_gbps * k)
    for kind in (StartKind.COLD, StartKind.WARM):
        assert timeline(kind, faster).first_token_s <= timeline(kind, i).first_token_s + 1e-9
