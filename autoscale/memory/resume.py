"""The envelope a restarted controller goes on from (issue 38, requirement 1): what it saved
before, or the config's prior, or nothing.

Why a pure step: Serve keeps the policy's state in the controller's memory only, so a controller
that restarts (or a redeploy) hands the policy an empty state, and the first burst after it would
be a surprise again. The adapter (deployments/control/autoscaling.py) saves the envelope in Ray's
KV store as it goes and gives it back here on an empty state.

A saved envelope older than one bucket is resumed with its rises, when the rate last came down
and how long its bursts lasted, and a fresh bucket clock: the
buckets that passed while no controller watched were not observed, and closing them as empty
would wipe the memory the save kept.
"""

from __future__ import annotations

from typing import Any

from hbmserve.autoscale.envelope import BurstEnvelope, bucket_of
from hbmserve.autoscale.policy_config import AutoscaleConfig


def resumed_envelope(saved: dict[str, Any] | None, now: float, config: AutoscaleConfig) -> BurstEnvelope | None:
    """The envelope to start a fresh policy state from; None: start from the config's prior (or
    empty). An unreadable save counts as none: the prior is a safe fallback, a crash is not."""
    if not saved or config.burst_memory_s <= 0:
        return None
    try:
        env = BurstEnvelope.from_dict(saved)
    except (KeyError, TypeError, ValueError):
        return None
    if now >= env.bucket_started_at + bucket_of(config):  # buckets went by unobserved
        return BurstEnvelope(bucket_started_at=now + config.look_back_s, rises_rps=env.rises_rps,
                             fell_at=env.fell_at, lengths_s=env.lengths_s, step_rps=env.step_rps,
                             misses=env.curves[:-1], prior_buckets=env.prior_buckets,
                             prior_base_rps=env.prior_base_rps)
    return env
