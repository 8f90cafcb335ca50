"""The one place the hand-off records (core/records.py) are written and read.

* Decision records: Ray's internal KV, key `autoscale/<app>/<deployment>` (namespace hbmserve),
  written on every policy tick by `DecisionLog`, which also sets Ray gauges that Prometheus
  scrapes with Ray's other metrics. Read by the front doors (which route to its
  `active_replicas`), `hbmserve status` and the benchmarks, through `latest_decision`.
* Replica endpoints: KV key `endpoint/<app>/<deployment>/<replica>`, renewed by each replica
  (`publish_endpoint`) every few seconds, read by the front doors (`live_endpoints`).
* Front doors: KV key `door/<door>`, renewed by each front door (`publish_door`), counted by
  every front door (`live_doors`) to split admission capacity.
* Ingress demand, the one signal that flows back to the policy: requests a front door holds and
  the rate it refuses for capacity, which no replica sees. KV key
  `demand/<app>/<deployment>/<front door>`, renewed by each front door while nonzero
  (`publish_demand`), summed by the policy (`ingress_demand`).
* Slot stats of a model both autoscaled and placed (one Serve deployment per planned slot): KV
  key `slot/<app>/<model deployment>/<slot>`, written by each slot's policy on every tick
  (`publish_slot_stats`), merged by the leading slot's policy (`slot_stats`).
  Renewed records carry the writer's wall clock; a reader ignores, and deletes, those older than
  their time to live, so a component that dies cannot pin a count or an address for long.
* `ReplicaInfo` / `IngressInfo`: what an engine replica's or front door's `info()` answers over
  a Serve handle. Plain JSON data on the wire (`info_reply`), not pickled classes, so that a
  caller and a replica of different versions still understand each other; typed again by
  `read_*_info`.

Each reader raises RecordError (a ValueError) with the KV key or reply it read on malformed
data. Thin on purpose: no decisions here. Every function imports Ray when called, so importing
this module starts and connects nothing.
"""

from __future__ import annotations

import time
from typing import Any

from hbmserve.core.records import (DecisionRecord, DoorEndpoint, IngressDemand, IngressInfo, RecordError, ReplicaEndpoint,
                                   ReplicaInfo, SlotStats)

KV_NAMESPACE = "hbmserve"


def _decision_key(app: str | None, deployment: str) -> str:
    return f"autoscale/{app or '-'}/{deployment}"


def _demand_key(app: str | None, deployment: str, holder: str = "") -> str:
    return f"demand/{app or '-'}/{deployment}/{holder}"


def _endpoint_key(ep: ReplicaEndpoint) -> str:
    return f"endpoint/{ep.app}/{ep.deployment}/{ep.replica}"


# A renewing writer renews every RENEW_S; a reader trusts a record for TTL_S (three renewals
# missed), so a dead writer's record is ignored within TTL_S.
RENEW_S = 2.0
TTL_S = 3 * RENEW_S


# Gauge name -> help. One series per app/deployment; values from the record in `publish`.
_GAUGES = {
    "hbmserve_autoscale_target_replicas": "Replicas the hbmserve policy asked Serve for",
    "hbmserve_autoscale_active_replicas": "Replicas assigned traffic",
    "hbmserve_autoscale_standby_replicas": "Hot standbys: loaded, out of rotation",
    "hbmserve_autoscale_held_requests": "Requests the front doors hold for lack of an active replica",
    "hbmserve_autoscale_refused_rps": "Requests/s the front doors refuse for capacity, counted as demand",
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
            "hbmserve_autoscale_refused_rps": decision.refused_rps_at_ingress,
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


def _kv():
    from ray.experimental import internal_kv

    return internal_kv


def _fresh_records(prefix: str, cls, ttl_s: float, now: float) -> list:
    """Records under `prefix` renewed within `ttl_s`; older ones are deleted (their writer died
    or stopped without cleaning up) and malformed ones skipped."""
    kv, out = _kv(), []
    for key in kv._internal_kv_list(prefix, namespace=KV_NAMESPACE):
        raw = kv._internal_kv_get(key, namespace=KV_NAMESPACE)
        try:
            record = cls.from_json(raw, source=f"Ray KV {KV_NAMESPACE}/{key!r}") if raw else None
        except RecordError:
            continue
        if record is None or now - record.at > ttl_s:
            kv._internal_kv_del(key, namespace=KV_NAMESPACE)
            continue
        out.append(record)
    return out


def _slot_key(app: str | None, deployment: str, slot: int | None = None) -> str:
    return f"slot/{app or '-'}/{deployment}/{'' if slot is None else slot}"


def publish_slot_stats(app: str | None, deployment: str, stats: SlotStats) -> None:
    kv = _kv()
    if kv._internal_kv_initialized():
        kv._internal_kv_put(_slot_key(app, deployment, stats.slot), stats.to_json(), overwrite=True,
                            namespace=KV_NAMESPACE)


def slot_stats(app: str | None, deployment: str, now: float) -> list[SlotStats]:
    """Every slot's latest stats, those renewed within TTL_S (a removed slot drops out)."""
    if not _kv()._internal_kv_initialized():
        return []
    return _fresh_records(_slot_key(app, deployment), SlotStats, TTL_S, now)


def publish_endpoint(ep: ReplicaEndpoint) -> None:
    _kv()._internal_kv_put(_endpoint_key(ep), ep.to_json(), overwrite=True, namespace=KV_NAMESPACE)


def remove_endpoint(ep: ReplicaEndpoint) -> None:
    _kv()._internal_kv_del(_endpoint_key(ep), namespace=KV_NAMESPACE)


def live_endpoints(now: float | None = None) -> list[ReplicaEndpoint]:
    """Every replica endpoint renewed within TTL_S (blocking: Ray internal KV)."""
    return _fresh_records("endpoint/", ReplicaEndpoint, TTL_S, time.time() if now is None else now)


def publish_door(door: DoorEndpoint) -> None:
    _kv()._internal_kv_put(f"door/{door.door}", door.to_json(), overwrite=True, namespace=KV_NAMESPACE)


def remove_door(door: DoorEndpoint) -> None:
    _kv()._internal_kv_del(f"door/{door.door}", namespace=KV_NAMESPACE)


def live_doors(now: float | None = None) -> list[DoorEndpoint]:
    """Every front door renewed within TTL_S (blocking: Ray internal KV)."""
    return _fresh_records("door/", DoorEndpoint, TTL_S, time.time() if now is None else now)


def publish_demand(app: str | None, deployment: str, holder: str, held: int, refused_rps: float) -> None:
    """Called by a front door while it holds or refuses requests for a model (and once with 0s after)."""
    record = IngressDemand(held=int(held), refused_rps=float(refused_rps), at=time.time())
    _kv()._internal_kv_put(_demand_key(app, deployment, holder), record.to_json(), overwrite=True,
                           namespace=KV_NAMESPACE)


def ingress_demand(app: str | None, deployment: str, now: float | None = None) -> IngressDemand:
    """The model's demand at all front doors now, summed; none outside a Ray cluster. Records not
    renewed within TTL_S (a front door that died) are dropped."""
    now = time.time() if now is None else now
    if not _kv()._internal_kv_initialized():
        return IngressDemand(held=0, at=now)
    records = _fresh_records(_demand_key(app, deployment), IngressDemand, TTL_S, now)
    return IngressDemand(held=sum(r.held for r in records), refused_rps=sum(r.refused_rps for r in records), at=now)


def info_reply(info: ReplicaInfo | IngressInfo) -> dict[str, Any]:
    """What an `info()` Serve method returns: the record as plain JSON data."""
    return info.to_dict()


def read_replica_info(reply: Any) -> ReplicaInfo:
    """An engine replica's `info()` reply, typed."""
    return ReplicaInfo.from_dict(reply, source="a replica's info() reply")


def read_ingress_info(reply: Any) -> IngressInfo:
    """A front door's `info()` reply, typed."""
    return IngressInfo.from_dict(reply, source="a front door's info() reply")
