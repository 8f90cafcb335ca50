"""The one place the hand-off records (core/records.py) are written and read.

* Decision records: Ray's internal KV, key `autoscale/<app>/<deployment>` (namespace hbmserve),
  written on every policy tick by `DecisionLog`, which also sets Ray gauges that Prometheus
  scrapes with Ray's other metrics. Read by the replicas (which follow its `active_replicas`),
  a model's gate, `hbmserve status` and the benchmarks, through `latest_decision`.
* The held-at-ingress count, the one signal that flows the other way: how many requests a
  model's gate (gate.py) holds while no replica serves. KV key `held/<app>/<deployment>`,
  written by the gate (`publish_held`), read by the policy (`held_at_ingress`).
* `ReplicaInfo` / `GateInfo`: what an engine replica's or gate's `info()` answers over a Serve
  handle. Plain JSON data on the wire (`info_reply`), not pickled classes, so that a caller and
  a replica of different versions still understand each other; typed again by `read_*_info`.

Each reader raises RecordError (a ValueError) with the KV key or reply it read on malformed
data. Thin on purpose: no decisions here. Every function imports Ray when called, so importing
this module starts and connects nothing.
"""

from __future__ import annotations

from typing import Any

from hbmserve.core.records import DecisionRecord, GateInfo, RecordError, ReplicaInfo

KV_NAMESPACE = "hbmserve"


def _decision_key(app: str | None, deployment: str) -> str:
    return f"autoscale/{app or '-'}/{deployment}"


def _held_key(app: str | None, deployment: str) -> str:
    return f"held/{app or '-'}/{deployment}"


# Gauge name -> help. One series per app/deployment; values from the record in `publish`.
_GAUGES = {
    "hbmserve_autoscale_target_replicas": "Replicas the hbmserve policy asked Serve for",
    "hbmserve_autoscale_active_replicas": "Replicas assigned traffic",
    "hbmserve_autoscale_standby_replicas": "Hot standbys: loaded, out of rotation",
    "hbmserve_autoscale_held_requests": "Requests held by a scale-to-zero gate",
}


class DecisionLog:
    """Publishes one policy's decisions; owns its gauges (one instance per policy object)."""

    def __init__(self) -> None:
        self._gauges: dict[str, Any] = {}

    def publish(self, app: str | None, deployment: str, decision: DecisionRecord) -> None:
        from ray.experimental import internal_kv
        from ray.util.metrics import Gauge

        if internal_kv._internal_kv_initialized():
            internal_kv._internal_kv_put(_decision_key(app, deployment), decision.to_json(), overwrite=True,
                                         namespace=KV_NAMESPACE)
        values = {
            "hbmserve_autoscale_target_replicas": decision.serve_target,
            "hbmserve_autoscale_active_replicas": len(decision.active_replicas),
            "hbmserve_autoscale_standby_replicas": len(decision.standby_replicas),
            "hbmserve_autoscale_held_requests": decision.held_at_ingress,
        }
        tags = {"application": app or "-", "deployment": deployment}
        for name, description in _GAUGES.items():
            if name not in self._gauges:
                self._gauges[name] = Gauge(name, description, tag_keys=("application", "deployment"))
            self._gauges[name].set(values[name], tags=tags)


def latest_decision(app: str | None, deployment: str) -> DecisionRecord | None:
    """The last decision for a deployment, or None if its policy never ran (fixed replicas)."""
    from ray.experimental import internal_kv

    key = _decision_key(app, deployment)
    raw = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
    return DecisionRecord.from_json(raw, source=f"Ray KV {KV_NAMESPACE}/{key}") if raw else None


def publish_held(app: str | None, deployment: str, held: int) -> None:
    """Called by a model's gate whenever the number of requests it holds changes."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(_held_key(app, deployment), str(int(held)), overwrite=True,
                                 namespace=KV_NAMESPACE)


def parse_held(raw: bytes | str | None, source: str = "") -> int:
    """The held count as stored (a decimal string); 0 when absent."""
    if not raw:
        return 0
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    if not text.strip().isdigit():
        raise RecordError(f"malformed held-at-ingress count from {source or 'Ray KV'}: {text!r:.40} "
                          "is not a non-negative integer")
    return int(text)


def held_at_ingress(app: str | None, deployment: str) -> int:
    """Requests the model's gate holds now (0 without a gate, or outside a Ray cluster)."""
    from ray.experimental import internal_kv

    if not internal_kv._internal_kv_initialized():
        return 0
    key = _held_key(app, deployment)
    return parse_held(internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE), f"Ray KV {KV_NAMESPACE}/{key}")


def info_reply(info: ReplicaInfo | GateInfo) -> dict[str, Any]:
    """What an `info()` Serve method returns: the record as plain JSON data."""
    return info.to_dict()


def read_replica_info(reply: Any) -> ReplicaInfo:
    """An engine replica's `info()` reply, typed."""
    return ReplicaInfo.from_dict(reply, source="a replica's info() reply")


def read_gate_info(reply: Any) -> GateInfo:
    """A gate's `info()` reply, typed."""
    return GateInfo.from_dict(reply, source="a gate's info() reply")


def read_ingress_info(reply: Any) -> ReplicaInfo | GateInfo:
    """The `info()` reply of an application's ingress: its gate for a model that may scale to
    zero, else one of its engine replicas; a gate's reply says `gate: true`."""
    if isinstance(reply, dict) and reply.get("gate") is True:
        return read_gate_info(reply)
    return read_replica_info(reply)
