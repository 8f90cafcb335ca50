"""Arrive in time (autoscale/memory/in_time.py `late_starts`, issue 38 requirement 3): cold replicas
for a burst they would arrive after are not ordered; faster tiers, new levels and bursts that
outlast a burst's length still are, and the reason says which and why."""

from __future__ import annotations

from dataclasses import replace

from hbmserve.autoscale.envelope import BurstEnvelope
from hbmserve.autoscale.memory.in_time import late_starts
from hbmserve.autoscale.policy import PolicyState, decide
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.core.scaling import ReplicaSnapshot, ReplicaState, Snapshot

CONFIG = AutoscaleConfig(replica_capacity_rps=2.0, max_replicas=8, burst_length_s=90.0, hot_standby_max=0,
                         warm_pool_max=0, upscale_delay_s=0.0)
SEEN = BurstEnvelope(bucket_started_at=0.0, previous_min_rps=1.0, rises_rps=(1.0, 12.0))  # lulls at 1, bursts 12 higher


def test_a_cold_start_longer_than_the_burst_is_not_ordered_for_a_known_burst():
    late = late_starts(2, 180.0, burst_age_s=5.0, rate_rps=8.0, env=SEEN, config=CONFIG)
    assert late is not None and late.dropped == 2 and late.left_s == 0.0
    assert late.describe().startswith("not in time: 2 replica(s) ready in 180s would find 0s of a 90-s burst")


def test_fast_help_new_levels_and_long_bursts_are_ordered():
    assert late_starts(2, 5.0, burst_age_s=5.0, rate_rps=8.0, env=SEEN, config=CONFIG) is None  # a hot standby
    assert late_starts(2, 180.0, burst_age_s=5.0, rate_rps=30.0, env=SEEN, config=CONFIG) is None  # past every peak
    assert late_starts(2, 180.0, burst_age_s=95.0, rate_rps=8.0, env=SEEN, config=CONFIG) is None  # outlasted a burst
    assert late_starts(2, 180.0, burst_age_s=5.0, rate_rps=8.0, env=None, config=CONFIG) is None  # no memory
    assert late_starts(2, 180.0, burst_age_s=5.0, rate_rps=3.0, env=SEEN, config=CONFIG) is None  # no burst: a steady miss
    first = BurstEnvelope(bucket_started_at=0.0, open_rise_rps=12.0, open_min_rps=1.0)  # the first burst, live
    assert late_starts(2, 180.0, burst_age_s=5.0, rate_rps=8.0, env=first, config=CONFIG) is None
    # A pricier miss makes the same late replica worth it: 2 req/s x 5 s left x $1 > its cost.
    dear = replace(CONFIG, burst_length_s=190.0, slo_miss_usd=1.0)
    assert late_starts(1, 180.0, burst_age_s=5.0, rate_rps=8.0, env=SEEN, config=dear) is None


def test_the_policy_holds_through_a_known_burst_and_says_why():
    snap = Snapshot(now=100.0, replicas=tuple(ReplicaSnapshot(f"r{i}", ReplicaState.ACTIVE, 30, 8, 0.5)
                                              for i in range(2)), arrival_rate_rps=8.0, ttft_samples_s=(9.0,) * 10)
    state = PolicyState(target_active=2, envelope=SEEN, up_since=95.0)
    decision, after = decide(snap, CONFIG, state)
    assert decision.target_active == 2 and "not in time" in decision.reason and decision.not_in_time > 0
    assert after.up_since == 95.0  # the wish stands: it is judged again as the burst ages
    assert after.envelope.burst_from == 100.0  # the envelope saw the burst start
    # Past a burst's length the same load is a new level: replicas are ordered.
    later, _ = decide(replace(snap, now=200.0), CONFIG, replace(after, up_since=95.0))
    assert later.target_active > 2 and "not in time" not in later.reason and later.not_in_time == 0


def test_how_long_bursts_last_is_learnt_from_those_seen():
    # Bursts of 12 rps over a lull at 1, 300 s each: the envelope measures them, and a 300-s burst
    # is worth a cold replica 20 s in (it finds 100 s of the burst), where a 90-s one is not.
    env = BurstEnvelope(bucket_started_at=0.0, previous_min_rps=1.0, rises_rps=(1.0, 12.0))
    t = 0.0
    for _ in range(3):
        for rate in [1.0] * 200 + [13.0] * 300:
            env, t = env.observe(t, rate, 180.0, 1800.0), t + 1
    assert env.lengths_s and all(295 <= s <= 305 for s in env.lengths_s)
    assert late_starts(1, 180.0, burst_age_s=20.0, rate_rps=13.0, env=env, config=CONFIG) is None
    late = late_starts(1, 180.0, burst_age_s=20.0, rate_rps=13.0, env=replace(env, lengths_s=()), config=CONFIG)
    assert late is not None and "90-s burst (burst_length_s)" in late.describe()
    short = replace(env, lengths_s=(60.0, 80.0, 400.0))
    assert "80-s burst (the median of 3 seen)" in late_starts(1, 180.0, burst_age_s=5.0, rate_rps=13.0, env=short,
                                                              config=CONFIG).describe()


def test_a_rise_past_every_peak_is_judged_once_bursts_have_been_seen_to_end():
    # lulls-0 with a prior: bursts of 15 rps where the past's highest was 12.7; they lasted about
    # 90 s, so cold replicas ordered as the rate passed the known top arrived in the lull.
    learnt = replace(SEEN, lengths_s=(60.0, 90.0, 120.0))
    late = late_starts(2, 180.0, burst_age_s=5.0, rate_rps=30.0, env=learnt, config=CONFIG)
    assert late is not None and "a 90-s burst (the median of 3 seen)" in late.describe()
    assert late_starts(2, 180.0, burst_age_s=5.0, rate_rps=30.0, env=SEEN, config=CONFIG) is None  # no length seen
    assert late_starts(2, 180.0, burst_age_s=95.0, rate_rps=30.0, env=learnt, config=CONFIG) is None  # a new level


def test_a_scale_up_the_rate_alone_asks_for_is_judged_as_a_symptom_s_is():
    # No symptom (no queue, TTFT well under target): the rate alone asks for more replicas.
    learnt = replace(SEEN, lengths_s=(60.0, 90.0, 120.0))
    snap = Snapshot(now=100.0, replicas=tuple(ReplicaSnapshot(f"r{i}", ReplicaState.ACTIVE, 0, 4, 0.2)
                                              for i in range(2)), arrival_rate_rps=8.0, ttft_samples_s=(0.1,) * 10)
    config = replace(CONFIG, rate_upscale_delay_s=0.0)
    decision, _ = decide(snap, config, PolicyState(target_active=2, envelope=learnt, up_since=95.0))
    assert decision.target_active == 2 and "not in time" in decision.reason
    long_bursts = replace(learnt, lengths_s=(600.0,) * 3)  # a burst of this service outlasts a cold start
    decision, _ = decide(snap, config, PolicyState(target_active=2, envelope=long_bursts, up_since=95.0))
    assert decision.target_active > 2 and "not in time" not in decision.reason


def test_a_burst_that_wobbles_about_half_its_height_is_one_burst_not_many_blips():
    # The rate dips to 6 (5 over the lull, under half the 12-rps rise) every 5th second of a
    # 300-s burst, as a look-back mean of Poisson arrivals does: one burst of about 300 s, not
    # sixty of 4 s, whose median would mark every burst as too short for a cold replica.
    env = BurstEnvelope(bucket_started_at=0.0, previous_min_rps=1.0, rises_rps=(1.0, 12.0))
    t = 0.0
    for rate in [1.0] * 200 + [6.0 if i % 5 == 4 else 13.0 for i in range(300)] + [1.0] * 200:
        env, t = env.observe(t, rate, 180.0, 1800.0), t + 1
    assert len(env.lengths_s) == 1 and 295 <= env.lengths_s[0] <= 305, env.lengths_s
