"""The envelope priced by each bucket's own backlog (autoscale/memory/backlog.py through envelope.py):
a burst's shape, not only its top, decides the hold; the prior's buckets stay; a hold changes
only when the change pays for its start; and the pool keeps no standby for steps the envelope
already holds replicas for (issue 38, requirement 4)."""

from __future__ import annotations

import json
from dataclasses import replace

from hbmserve.autoscale.memory.backlog import step_of
from hbmserve.autoscale.envelope import BurstEnvelope, bucket_misses, burst_floor, known_peak, observed_envelope
from hbmserve.autoscale.memory.prior import learn_prior, learnt_config
from hbmserve.autoscale.memory.resume import resumed_envelope
from hbmserve.autoscale.policy import PolicyState
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.stages import pool_for
from hbmserve.autoscale.signals import RateTrend
from hbmserve.core.autoscaling_spec import PriorSpec

import pytest

CAP = 5.0
CONFIG = AutoscaleConfig(replica_capacity_rps=CAP, max_replicas=8)


def _drive(rates: list[float], config: AutoscaleConfig = CONFIG, env: BurstEnvelope | None = None,
           start: float = 0.0) -> BurstEnvelope:
    for i, r in enumerate(rates):
        env = observed_envelope(env, start + i, r, config)
    assert env is not None
    return env


def _with_prior(env: BurstEnvelope) -> BurstEnvelope:
    """`env` as if its buckets had come with a prior: the curves price only a memory with one."""
    return replace(env, prior_buckets=len(env.rises_rps))


def test_a_brief_top_holds_fewer_replicas_than_a_long_one_of_the_same_height():
    # Both rise from 1 to 17 req/s, four times in half an hour; three replicas carry 15.
    brief = _with_prior(_drive(([1.0] * 400 + [17.0] * 8 + [14.0] * 40) * 4))
    long_ = _with_prior(_drive(([1.0] * 330 + [17.0] * 120) * 4))
    assert max(brief.peaks_rps) == pytest.approx(max(long_.peaks_rps), abs=0.5)
    assert burst_floor(brief, CONFIG).replicas == 3
    assert burst_floor(long_, CONFIG).replicas == 4
    # The top alone (the rectangle: 90 s at the peak) holds 4 for both; so does a memory with
    # no prior, which the rectangle prices until one has seen the traffic's tail.
    top_only = replace(brief, step_rps=0.0, misses=(None,) * len(brief.rises_rps))
    assert burst_floor(top_only, CONFIG).replicas == 4
    assert burst_floor(replace(brief, prior_buckets=0), CONFIG).replicas == 4


def test_inside_a_known_peak_a_hold_the_curves_say_misses_nothing_caps_the_trend():
    brief = _with_prior(_drive(([1.0] * 400 + [17.0] * 8 + [14.0] * 40) * 4))
    floor = burst_floor(brief, CONFIG)
    assert floor.replicas == 3 and floor.misses_per_bucket < 1.0
    rectangle = known_peak(brief, 10.0, CONFIG)
    assert rectangle is not None and rectangle.replicas == 4 and not rectangle.by_curves
    known = known_peak(brief, 10.0, CONFIG, floor)
    assert known is not None and known.by_curves and known.replicas == 3
    assert known.peak_rps == 3 * CAP  # the pool covers what the three carry, no standby past it
    assert "miss none of them" in known.describe()
    # A floor that expects misses, or a memory with no prior (the rectangle's), caps nothing.
    missing = replace(floor, misses_per_bucket=5.0)
    assert known_peak(brief, 10.0, CONFIG, missing).replicas == 4
    no_prior = replace(brief, prior_buckets=0)
    assert known_peak(no_prior, 10.0, CONFIG, burst_floor(no_prior, CONFIG)).replicas == 4

def test_the_prior_s_buckets_are_never_forgotten_and_live_ones_are():
    past = [t / 10.0 for t in range(0, 36_000)]  # 10 req/s for an hour: one level, no burst
    bursty = [t for t in past if (t % 600) < 540 or int(t * 10) % 3 == 0]  # lulls: 10 -> 3.3 req/s
    prior = learn_prior(bursty, CONFIG, source="past")
    config = learnt_config(CONFIG, prior)
    quiet = _drive([0.5] * 3 * 3600, config)
    assert quiet.prior_buckets == len(prior.rises_rps)
    assert quiet.rises_rps[:quiet.prior_buckets] == prior.rises_rps
    assert len(quiet.rises_rps) == quiet.prior_buckets + int(CONFIG.burst_memory_s / 180.0)
    assert quiet.misses[:quiet.prior_buckets] == prior.misses


def test_a_hold_changes_only_when_the_change_pays_for_a_start():
    env = _with_prior(_drive(([11.0] * 330 + [15.5] * 120) * 4))  # three carry the base, four the bursts
    hold_usd = CONFIG.hot_idle_usd_per_hour * 180.0 / 3600.0  # a replica held one bucket

    def mean_misses(n: int) -> float:
        each = bucket_misses(env, n * CAP, length_s=90.0, ttft_s=2.0, bucket_s=180.0)
        return sum(each) / len(each)

    saved = mean_misses(3) - mean_misses(4)  # what a fourth replica saves a bucket
    assert saved > 0
    # Priced so that the fourth saves 1.5 holds: worth it from nothing, not worth a start.
    config = replace(CONFIG, slo_miss_usd=1.5 * hold_usd / saved)
    assert burst_floor(env, config).replicas == 4
    assert burst_floor(env, config, held=4).replicas == 4
    assert burst_floor(env, config, held=3).replicas == 3
    # Far off, the change pays: the hold moves.
    assert burst_floor(env, config, held=8).replicas == 4
    # Without a prior the memory is short, and the hold follows the best count at once.
    assert burst_floor(replace(env, prior_buckets=0), config, held=3).replicas == \
        burst_floor(replace(env, prior_buckets=0), config).replicas


def test_the_curves_survive_json_a_restart_and_a_prior_file():
    env = _drive(([1.0] * 330 + [17.0] * 120) * 2)
    state = PolicyState(target_active=3, envelope=env)
    assert PolicyState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    resumed = resumed_envelope(json.loads(json.dumps(state.to_dict()))["envelope"], env.bucket_started_at + 10_000, CONFIG)
    assert resumed is not None and resumed.misses == env.misses and resumed.step_rps == step_of(CAP)
    prior = learn_prior([t / 4.0 for t in range(4 * 3600)], CONFIG)
    assert PriorSpec.model_validate(json.loads(prior.model_dump_json())) == prior
    with pytest.raises(ValueError, match="misses"):
        PriorSpec(bucket_s=180.0, rises_rps=(1.0, 2.0), misses=((3.0,),), miss_step_rps=1.0)


def test_a_prior_without_curves_is_priced_by_the_rectangle():
    # A prior learnt before the curves: its buckets are priced from their rises alone.
    old = replace(CONFIG, prior_rises_rps=(0.5, 14.0, 14.0), prior_base_rps=1.0)
    env = observed_envelope(None, 0.0, 0.0, old)
    assert env is not None and env.misses == (None, None, None)
    assert burst_floor(env, old).replicas == 3  # 15 req/s of peak at 5 a replica


def test_the_pool_keeps_no_standby_for_a_step_the_envelope_holds_replicas_for():
    stepped = RateTrend(level=5.0, baseline=5.0, slope=0.0, variance=0.0, at=0.0,
                        surge_level=25.0, surge_count=1.0, exposure_s=1000.0, z=1.0)
    remembered = _drive(([1.0] * 330 + [17.0] * 120) * 2)
    from hbmserve.autoscale.stages import read_signals
    from hbmserve.core.scaling import Snapshot
    signals = read_signals(Snapshot(now=remembered.seen_at + 1, replicas=(), arrival_rate_rps=5.0), CONFIG,
                           PolicyState(target_active=1, trend=stepped, envelope=remembered))
    fresh = replace(signals, envelope=None)
    assert pool_for(fresh, CONFIG, 2).hot > 0  # the step's own model: a standby for the step
    assert pool_for(signals, CONFIG, 2).hot == 0
