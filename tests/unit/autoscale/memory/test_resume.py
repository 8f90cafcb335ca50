"""Where a fresh policy state's envelope comes from (autoscale/memory/resume.py): the save, with
its clock restarted when buckets went by unobserved; nothing for an unreadable save."""

from __future__ import annotations

from dataclasses import asdict

from hbmserve.autoscale.envelope import BurstEnvelope
from hbmserve.autoscale.memory.resume import resumed_envelope
from hbmserve.autoscale.policy_config import AutoscaleConfig

CONFIG = AutoscaleConfig()  # 180-s buckets, a 30-s look-back


def test_a_recent_save_goes_on_as_it_was_and_an_old_one_keeps_its_rises_on_a_new_clock():
    saved = asdict(BurstEnvelope(bucket_started_at=1_000.0, open_rise_rps=2.0, open_min_rps=1.0,
                                 rises_rps=(3.0, 8.0), fell_at=990.0, burst_from=1_050.0, lengths_s=(70.0, 95.0)))
    assert resumed_envelope(saved, 1_100.0, CONFIG) == BurstEnvelope.from_dict(saved)
    old = resumed_envelope(saved, 50_000.0, CONFIG)
    assert old.rises_rps == (3.0, 8.0) and old.bucket_started_at == 50_030.0 and old.open_rise_rps == 0.0
    # What it learnt stays (the rate came down, how long bursts last); the burst it was in is over.
    assert old.fell_at == 990.0 and old.lengths_s == (70.0, 95.0) and old.burst_from is None


def test_no_save_an_unreadable_one_or_the_envelope_off_start_from_the_prior():
    assert resumed_envelope(None, 0.0, CONFIG) is None
    assert resumed_envelope({"rises_rps": "x"}, 0.0, CONFIG) is None
    assert resumed_envelope({"bucket_started_at": "soon"}, 0.0, CONFIG) is None
    saved = asdict(BurstEnvelope(bucket_started_at=0.0, rises_rps=(3.0,)))
    off = AutoscaleConfig(burst_memory_s=0.0)
    assert resumed_envelope(saved, 10.0, off) is None
