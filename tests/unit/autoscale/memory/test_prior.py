"""The burst envelope's prior (autoscale/memory/prior.py, issue 38 requirement 1): learnt from a
past trace by the same envelope, summarised to what the envelope remembers, and taken by the
policy at its first decision, so the first burst after a (re)deploy is no surprise."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hbmserve.autoscale.envelope import bucket_of
from hbmserve.autoscale.memory.prior import learn_prior, observed_rises, summarise
from hbmserve.autoscale.policy import PolicyState, decide
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.core.scaling import ReplicaSnapshot, ReplicaState, Snapshot

CONFIG = AutoscaleConfig(replica_capacity_rps=2.0, max_replicas=12, min_replicas=1)


def bursty(hours: float = 2.0, base_rps: float = 1.0, burst_rps: float = 10.0, every_s: float = 600.0,
           burst_s: float = 60.0) -> list[float]:
    """Evenly spaced arrivals: `base_rps`, and `burst_rps` for `burst_s` every `every_s`."""
    out, t = [], 0.0
    while t < hours * 3600:
        out.append(t)
        t += 1.0 / (burst_rps if t % every_s >= every_s - burst_s else base_rps)
    return out


def test_bursts_of_the_past_are_learnt_as_rises_and_kept_to_what_the_envelope_remembers():
    prior = learn_prior(bursty(), CONFIG, source="past.csv")
    keep = int(CONFIG.burst_memory_s / bucket_of(CONFIG))
    assert prior.bucket_s == bucket_of(CONFIG) == 180.0
    assert len(prior.rises_rps) == keep and list(prior.rises_rps) == sorted(prior.rises_rps)
    # A 60-s burst fills the 30-s look-back: the rise is the burst over the base, 9 req/s.
    assert max(prior.rises_rps) == pytest.approx(9.0, abs=0.2)
    assert min(prior.rises_rps) < 1.0  # the lulls' buckets keep their share
    assert prior.learned_from.startswith("past.csv (") and "buckets of 180 s" in prior.learned_from


def test_how_long_the_past_s_bursts_lasted_is_learnt_and_taken_by_the_config():
    prior = learn_prior(bursty(burst_s=120.0), CONFIG, source="past.csv")
    # 120-s bursts seen through a 30-s look-back mean: above half their height for about 120 s
    # (the first is measured short: it ends before the envelope knows its full height).
    assert prior.lengths_s and 100 <= sorted(prior.lengths_s)[len(prior.lengths_s) // 2] <= 140, prior.lengths_s
    assert "bursts)" in prior.learned_from
    from hbmserve.autoscale.envelope import observed_envelope
    from hbmserve.autoscale.memory.prior import learnt_config

    env = observed_envelope(None, 0.0, 0.0, learnt_config(CONFIG, prior))
    assert env.lengths_s == prior.lengths_s[-len(env.lengths_s):] and env.fell_at == 0.0


def test_a_flat_past_teaches_no_burst():
    prior = learn_prior(bursty(burst_rps=1.0), CONFIG)
    assert max(prior.rises_rps) < 0.2


def test_quantiles_keep_the_extremes_and_the_spread():
    assert summarise([5, 1, 3], 5) == (1, 3, 5)
    assert summarise(range(101), 5) == (0, 25, 50, 75, 100)
    assert summarise([4, 9, 2], 1) == (9,)


def test_a_past_shorter_than_a_bucket_has_nothing_to_teach():
    with pytest.raises(ValueError, match="needs at least one 180-s bucket"):
        learn_prior([0.0, 10.0, 100.0], CONFIG)
    with pytest.raises(ValueError, match="envelope is off"):
        learn_prior(bursty(), replace(CONFIG, burst_memory_s=0.0))


def _first_decision(config: AutoscaleConfig) -> int:
    snap = Snapshot(now=0.0, replicas=(ReplicaSnapshot("r0", ReplicaState.ACTIVE, 0, 0, 0.0),),
                    arrival_rate_rps=0.5)
    decision, _ = decide(snap, config, PolicyState())
    return decision.burst_hold


def test_the_policy_starts_from_the_prior_and_holds_for_the_bursts_it_remembers():
    prior = learn_prior(bursty(), CONFIG)
    with_prior = replace(CONFIG, prior_rises_rps=prior.rises_rps, prior_source=prior.learned_from)
    assert _first_decision(CONFIG) == 0  # no memory: the first burst would be a surprise
    assert _first_decision(with_prior) >= 3  # 9 req/s over 2 per replica, at 0.01 $ a miss
    # The memory is the envelope's: live buckets replace the prior's, the smallest first.
    assert observed_rises(bursty(burst_rps=1.0, hours=0.5), CONFIG) != prior.rises_rps


def test_a_rate_history_becomes_the_arrivals_it_counts_spread_over_each_step():
    from hbmserve.autoscale.memory.prior import arrivals_of_rates

    # 15-s steps: 0.2 req/s is 3 requests a step, spread evenly; 0.1 req/s carries its halves over.
    got = arrivals_of_rates([(115.0, 0.2), (130.0, 0.1), (145.0, 0.1), (160.0, 0.0)], 15.0)
    assert got == [2.5, 7.5, 12.5, 15.0 + 7.5, 30.0 + 3.75, 30.0 + 11.25]
    assert arrivals_of_rates([], 15.0) == [] and arrivals_of_rates([(15.0, -1.0)], 15.0) == []
