"""Where live scaling decisions go: Ray's internal KV (read by `hbmserve status`, and by the
replicas, which follow the `active_replicas` in it) and a Ray metric (scraped by Prometheus with
Ray's other metrics). Also the one signal that flows the other way: how many requests a model's
gate (deployments/gate.py) holds while no replica serves.

Thin on purpose, no decisions here.
"""

from __future__ import annotations

import json
from typing import Any

KV_NAMESPACE = "hbmserve"


def _key(app: str | None, deployment: str) -> str:
    return f"autoscale/{app or '-'}/{deployment}"


def _held_key(app: str | None, deployment: str) -> str:
    return f"held/{app or '-'}/{deployment}"


# Gauge name -> (help, what of the decision record it shows). One series per app/deployment.
_GAUGES = {
    "hbmserve_autoscale_target_replicas": ("Replicas the hbmserve policy asked Serve for", "serve_target"),
    "hbmserve_autoscale_active_replicas": ("Replicas assigned traffic", "active"),
    "hbmserve_autoscale_standby_replicas": ("Hot standbys: loaded, out of rotation", "standby"),
    "hbmserve_autoscale_held_requests": ("Requests held by a scale-to-zero gate", "held_at_ingress"),
}


class DecisionLog:
    def __init__(self) -> None:
        self._gauges: dict = {}

    def publish(self, app: str | None, deployment: str, serve_target: int, decision: dict[str, Any]) -> None:
        from ray.experimental import internal_kv
        from ray.util.metrics import Gauge

        record = {**decision, "serve_target": serve_target}
        if internal_kv._internal_kv_initialized():
            internal_kv._internal_kv_put(_key(app, deployment), json.dumps(record), overwrite=True,
                                         namespace=KV_NAMESPACE)
        values = {"serve_target": serve_target, "active": len(record.get("active_replicas", ())),
                  "standby": len(record.get("standby_replicas", ())),
                  "held_at_ingress": record.get("held_at_ingress", 0)}
        tags = {"application": app or "-", "deployment": deployment}
        for name, (description, field) in _GAUGES.items():
            if name not in self._gauges:
                self._gauges[name] = Gauge(name, description, tag_keys=("application", "deployment"))
            self._gauges[name].set(values[field], tags=tags)


def publish_held(app: str | None, deployment: str, held: int) -> None:
    """Called by a model's gate whenever the number of requests it holds changes."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(_held_key(app, deployment), str(held), overwrite=True, namespace=KV_NAMESPACE)


def held_at_ingress(app: str | None, deployment: str) -> int:
    """Requests the model's gate holds now (0 without a gate, or outside a Ray cluster)."""
    from ray.experimental import internal_kv

    if not internal_kv._internal_kv_initialized():
        return 0
    raw = internal_kv._internal_kv_get(_held_key(app, deployment), namespace=KV_NAMESPACE)
    return int(raw) if raw else 0


def latest_decision(app: str | None, deployment: str) -> dict[str, Any] | None:
    """The last decision for a deployment, or None if its policy never ran (fixed replicas)."""
    from ray.experimental import internal_kv

    raw = internal_kv._internal_kv_get(_key(app, deployment), namespace=KV_NAMESPACE)
    return json.loads(raw) if raw else None
