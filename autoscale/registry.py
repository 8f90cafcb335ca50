"""Policies by name, each built from one cluster-level spec so that runs compare like for like.

    entry = POLICIES["hbmserve"]
    config = entry.make_config(spec)
    state = entry.initial_state()
    decision, state = entry.decide(snapshot, config, state)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from hbmserve.autoscale.baselines import (
    QueueThresholdConfig,
    QueueThresholdState,
    RayDefaultConfig,
    RayDefaultState,
    StaticPeakConfig,
    StaticPeakState,
    queue_threshold_decide,
    ray_default_decide,
    static_peak_decide,
)
from hbmserve.autoscale.policy import AutoscaleConfig, PolicyState, decide
from hbmserve.core.scaling import Tier


@dataclass(frozen=True)
class ScalingSpec:
    """What every policy is told about the cluster and the SLO (the issue's reference
    cluster by default: 70B-shaped model on H100 TP=4, 1 to 16 replicas)."""

    min_replicas: int = 1
    max_replicas: int = 16
    ttft_p95_target_s: float = 2.0
    tpot_p95_target_s: float | None = 0.1  # None: TPOT is no scaling signal
    target_queue_per_replica: float = 4.0
    replica_capacity_rps: float = 1.0  # measured per replica at the SLO
    target_utilization: float = 0.8
    startup_hot_s: float = 5.0
    startup_warm_s: float = 45.0
    startup_cold_s: float = 180.0
    # Peak arrival rate of the trace (rps, over the evaluation's window); static-peak only.
    # None: static-peak holds max_replicas.
    peak_rps: float | None = None

    @property
    def startup_s(self) -> dict[Tier, float]:
        return {Tier.HOT: self.startup_hot_s, Tier.WARM: self.startup_warm_s,
                Tier.COLD: self.startup_cold_s}


def hbmserve_config(spec: ScalingSpec) -> AutoscaleConfig:
    return AutoscaleConfig(
        min_replicas=spec.min_replicas, max_replicas=spec.max_replicas,
        ttft_p95_target_s=spec.ttft_p95_target_s,
        tpot_p95_target_s=spec.tpot_p95_target_s,
        target_queue_per_replica=spec.target_queue_per_replica,
        replica_capacity_rps=spec.replica_capacity_rps,
        target_utilization=spec.target_utilization,
        downscale_utilization=spec.target_utilization * 0.875,  # 0.7 at the default 0.8
        startup_hot_s=spec.startup_hot_s, startup_warm_s=spec.startup_warm_s,
        startup_cold_s=spec.startup_cold_s,
    )


def ray_default_config(spec: ScalingSpec) -> RayDefaultConfig:
    # Only the bounds come from the cluster: everything else is Ray's default.
    return RayDefaultConfig(min_replicas=spec.min_replicas, max_replicas=spec.max_replicas)


def static_peak_config(spec: ScalingSpec) -> StaticPeakConfig:
    if spec.peak_rps is None:
        return StaticPeakConfig(replicas=spec.max_replicas)
    # Same utilisation target as hbmserve's, so both aim at the same headroom.
    need = math.ceil(spec.peak_rps / (spec.replica_capacity_rps * spec.target_utilization))
    return StaticPeakConfig(replicas=max(spec.min_replicas, min(spec.max_replicas, max(need, 1))))


def queue_threshold_config(spec: ScalingSpec) -> QueueThresholdConfig:
    return QueueThresholdConfig(min_replicas=spec.min_replicas, max_replicas=spec.max_replicas,
                                scale_up_queue=spec.target_queue_per_replica)


@dataclass(frozen=True)
class PolicyEntry:
    decide: Callable[..., tuple[Any, Any]]
    make_config: Callable[[ScalingSpec], Any]
    initial_state: Callable[[], Any]


POLICIES: dict[str, PolicyEntry] = {
    "hbmserve": PolicyEntry(decide, hbmserve_config, PolicyState),
    "ray-default": PolicyEntry(ray_default_decide, ray_default_config, RayDefaultState),
    "static-peak": PolicyEntry(static_peak_decide, static_peak_config, StaticPeakState),
    "queue-threshold": PolicyEntry(queue_threshold_decide, queue_threshold_config,
                                   QueueThresholdState),
}
