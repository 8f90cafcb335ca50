"""A model's config-file autoscaling section -> the policy's AutoscaleConfig. Pure.

Goes through the same `registry.hbmserve_config` the evaluation harness uses, so the live
system and the simulator tune the policy from one mapping.
"""

from __future__ import annotations

import dataclasses

from hbmserve.autoscale.policy import AutoscaleConfig
from hbmserve.autoscale.registry import ScalingSpec, hbmserve_config
from hbmserve.core.config import ModelSpec


def autoscale_config_for(model: ModelSpec) -> AutoscaleConfig | None:
    """None when the model has a fixed replica count."""
    a = model.autoscaling
    if a is None:
        return None
    spec = ScalingSpec(
        min_replicas=a.min_replicas, max_replicas=a.max_replicas,
        ttft_p95_target_s=model.slo.ttft_p95_ms / 1000.0,
        tpot_p95_target_s=model.slo.tpot_p95_ms / 1000.0,
        target_queue_per_replica=a.target_queue_per_replica,
        replica_capacity_rps=a.replica_capacity_rps,
        startup_hot_s=a.startup_s.hot, startup_warm_s=a.startup_s.warm, startup_cold_s=a.startup_s.cold,
    )
    return dataclasses.replace(
        hbmserve_config(spec),
        # Hot standbys are replicas out of rotation (autoscale/roles.py). Warm nodes (up, weights
        # on NVMe, no engine) are provisioned by the cluster's node autoscaler, which this policy
        # does not drive, so the live warm pool stays empty rather than be counted as capacity.
        hot_standby_min=a.hot_standby.min,
        hot_standby_max=a.hot_standby.max,
        warm_pool_min=0,
        warm_pool_max=0,
        upscale_delay_s=a.upscale_delay_s,
        downscale_delay_s=a.downscale_delay_s,
        downscale_cooldown_s=a.downscale_cooldown_s,
    )
