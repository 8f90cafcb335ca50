"""Policies by name. Each baseline's config is derived from hbmserve's own AutoscaleConfig for
the model (autoscale/policy_config.py, the one builder), so runs compare like for like:

    entry = POLICIES["hbmserve"]
    config = entry.make_config(autoscale_config_for(model), peak_rps)
    state = entry.initial_state()
    decision, state = entry.decide(snapshot, config, state)

Besides hbmserve and Ray Serve's default, the baselines are what a platform engineer would
deploy without hbmserve: a fixed fleet sized for the peak (static-peak; every size is the static
frontier, capacity/sim/frontier.py), a queue threshold, and on Kubernetes the HPA or KEDA on the queue
with their stock defaults (k8s-hpa, keda: k8s_baselines.py).

The oracle is the exception: it is `clairvoyant`, planned from the whole trace and the
simulator by its driver (capacity/sim/oracle_search.py), so its config is a schedule, not derived here.
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
from hbmserve.autoscale.k8s_baselines import (
    HpaConfig,
    HpaState,
    KedaConfig,
    KedaState,
    hpa_decide,
    keda_decide,
)
from hbmserve.autoscale.oracle import OracleConfig, OracleState, oracle_decide
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.policy import PolicyState, decide


def hbmserve_config(config: AutoscaleConfig, peak_rps: float | None = None) -> AutoscaleConfig:
    return config


def ray_default_config(config: AutoscaleConfig, peak_rps: float | None = None) -> RayDefaultConfig:
    # Only the bounds come from the cluster: everything else is Ray's default.
    return RayDefaultConfig(min_replicas=config.min_replicas, max_replicas=config.max_replicas)


def static_peak_config(config: AutoscaleConfig, peak_rps: float | None = None) -> StaticPeakConfig:
    """`peak_rps`: the trace's peak arrival rate; None holds max_replicas."""
    if peak_rps is None:
        return StaticPeakConfig(replicas=config.max_replicas)
    # Same utilisation target as hbmserve's, so both aim at the same headroom.
    need = math.ceil(peak_rps / (config.replica_capacity_rps * config.target_utilization))
    return StaticPeakConfig(replicas=max(config.min_replicas, min(config.max_replicas, max(need, 1))))


def queue_threshold_config(config: AutoscaleConfig,
                           peak_rps: float | None = None) -> QueueThresholdConfig:
    return QueueThresholdConfig(min_replicas=config.min_replicas, max_replicas=config.max_replicas,
                                scale_up_queue=config.target_queue_per_replica)


def hpa_config(config: AutoscaleConfig, peak_rps: float | None = None) -> HpaConfig:
    # Kubernetes' defaults; the cluster's bounds (an HPA's minReplicas is at least 1) and its
    # queue target, as a platform engineer would write them.
    return HpaConfig(min_replicas=max(1, config.min_replicas), max_replicas=config.max_replicas,
                     target_queue_per_replica=config.target_queue_per_replica)


def keda_config(config: AutoscaleConfig, peak_rps: float | None = None) -> KedaConfig:
    # KEDA's defaults; the cluster's bounds and its queue target as the trigger's threshold.
    return KedaConfig(min_replicas=config.min_replicas, max_replicas=config.max_replicas,
                      target_queue_length=config.target_queue_per_replica)


def oracle_config(config: AutoscaleConfig, peak_rps: float | None = None) -> OracleConfig:
    raise ValueError("the oracle's config is a schedule planned from the whole trace by its "
                     "driver (capacity/sim/oracle_search.py plan_oracle), not derived from a config")


@dataclass(frozen=True)
class PolicyEntry:
    decide: Callable[..., tuple[Any, Any]]
    # (hbmserve's AutoscaleConfig for the model, the trace's peak rps or None) -> this policy's config
    make_config: Callable[[AutoscaleConfig, float | None], Any]
    initial_state: Callable[[], Any]
    # True: the policy is planned from the whole trace by the driver (capacity/sim/oracle_search.py), which
    # builds its config; make_config is not called.
    clairvoyant: bool = False


POLICIES: dict[str, PolicyEntry] = {
    "hbmserve": PolicyEntry(decide, hbmserve_config, PolicyState),
    "ray-default": PolicyEntry(ray_default_decide, ray_default_config, RayDefaultState),
    "static-peak": PolicyEntry(static_peak_decide, static_peak_config, StaticPeakState),
    "queue-threshold": PolicyEntry(queue_threshold_decide, queue_threshold_config,
                                   QueueThresholdState),
    "k8s-hpa": PolicyEntry(hpa_decide, hpa_config, HpaState),
    "keda": PolicyEntry(keda_decide, keda_config, KedaState),
    "oracle": PolicyEntry(oracle_decide, oracle_config, OracleState, clairvoyant=True),
}
