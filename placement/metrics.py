"""Prometheus gauges and the log line for placement verification.

Metrics are created in a function that takes the registry, so importing this module registers
nothing (no global registry side effects) and tests can use a fresh CollectorRegistry.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge

from hbmserve.placement.verification import Crossing, VerificationResult


@dataclass(frozen=True)
class PlacementMetrics:
    verified: Gauge
    crossed_groups: Gauge
    extra_allreduce_us: Gauge


def make_placement_metrics(registry: CollectorRegistry, namespace: str = "hbmserve") -> PlacementMetrics:
    labels = ["deployment", "replica"]
    return PlacementMetrics(
        verified=Gauge("placement_verified", "1 when every TP group of the replica sits where the "
                       "plan put it, inside one NVLink island; 0 otherwise",
                       labels, namespace=namespace, registry=registry),
        crossed_groups=Gauge("placement_crossed_groups", "TP groups of the replica that crossed an "
                             "NVLink island or node, or left their planned node",
                             labels, namespace=namespace, registry=registry),
        extra_allreduce_us=Gauge("placement_extra_allreduce_microseconds", "Predicted extra time "
                                 "per all-reduce caused by the observed placement",
                                 labels, namespace=namespace, registry=registry),
    )


def record_verification(metrics: PlacementMetrics, deployment: str, result: VerificationResult) -> None:
    labels = {"deployment": deployment, "replica": str(result.replica)}
    metrics.verified.labels(**labels).set(1.0 if result.placement_verified else 0.0)
    metrics.crossed_groups.labels(**labels).set(
        sum(1 for g in result.groups if g.crossing is not Crossing.NONE)
    )
    metrics.extra_allreduce_us.labels(**labels).set(result.expected_extra_allreduce_us)


def log_verification(result: VerificationResult, logger: logging.Logger, deployment: str) -> None:
    if result.warning is not None:
        logger.warning("placement of %s: %s", deployment, result.warning)
    else:
        logger.info("placement of %s: %s", deployment, result.reason)
