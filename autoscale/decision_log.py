"""Where live scaling decisions go, so operators can see them: Ray's internal KV (read by
`hbmserve status`) and a Ray metric (scraped by Prometheus with Ray's other metrics).

Called from the policy inside the Serve controller; thin on purpose, no decisions here.
"""

from __future__ import annotations

import json
from typing import Any

KV_NAMESPACE = "hbmserve"


def _key(app: str | None, deployment: str) -> str:
    return f"autoscale/{app or '-'}/{deployment}"


class DecisionLog:
    def __init__(self) -> None:
        self._gauge = None

    def publish(self, app: str | None, deployment: str, serve_target: int, decision: dict[str, Any]) -> None:
        from ray.experimental import internal_kv
        from ray.util.metrics import Gauge

        if internal_kv._internal_kv_initialized():
            record = {**decision, "serve_target": serve_target}
            internal_kv._internal_kv_put(_key(app, deployment), json.dumps(record), overwrite=True,
                                         namespace=KV_NAMESPACE)
        if self._gauge is None:
            self._gauge = Gauge("hbmserve_autoscale_target_replicas", "Replicas the hbmserve policy asked Serve for",
                                tag_keys=("application", "deployment"))
        self._gauge.set(serve_target, tags={"application": app or "-", "deployment": deployment})


def latest_decision(app: str | None, deployment: str) -> dict[str, Any] | None:
    """The last decision for a deployment, or None if its policy never ran (fixed replicas)."""
    from ray.experimental import internal_kv

    raw = internal_kv._internal_kv_get(_key(app, deployment), namespace=KV_NAMESPACE)
    return json.loads(raw) if raw else None
