"""The one place the hand-off records (core/records.py) are written and read.

* Decision records: Ray's internal KV, key `autoscale/<app>/<deployment>` (namespace hbmserve),
  written on every policy tick by `DecisionLog`, which also sets Ray gauges that Prometheus
  scrapes with Ray's other metrics. Read by the front doors (which route to its
  `active_replicas`), `hbmserve status` and the benchmarks, through `latest_decision`.
  The decisions that changed the plan (targets, pool, active set) are also kept, the last
  DECISION_HISTORY of them, under `autoscale-log/<app>/<deployment>`: the ops dashboard's
  decision log (`recent_decisions`).
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
* The warm tier: KV key `warm-tier`, renewed by the cluster's one aggregator
  (deployments/control/warm_tier.py, `publish_warm_tier`), read by the policy and status
  (`latest_warm_tier`, None once stale: the aggregator stopped).
* The deployment itself (core/rollout_records.py): KV key `deployed`, written by each deploy and
  rollout step (`publish_deployed`, `latest_deployed`); a model's rollout under
  `rollout/<model>`, kept after it ends (`publish_rollout`, `rollouts`).
* `ReplicaInfo` / `IngressInfo`: what an engine replica's or front door's `info()` answers over
  a Serve handle. Plain JSON data on the wire (`info_reply`), not pickled classes, so that a
  caller and a replica of different versions still understand each other; typed again by
  `read_*_info`.

Each reader raises RecordError (a ValueError) with the KV key or reply it read on malformed
data. Thin on purpose: no decisions here. Every function imports Ray when called, so importing
this module starts and connects nothing.
"""

from __future__ import annotations

import json
import time
from typing import Any

from hbmserve.core.records import (DecisionRecord, DoorEndpoint, IngressDemand, RecordError, ReplicaEndpoint,
                                   ReplicaInfo, ReplicaRoles, SlotStats, WarmTierRecord)
from hbmserve.core.door_records import IngressInfo
from hbmserve.core.rollout_records import DeployedRecord, RolloutRecord
from hbmserve.core.scaling import Tier

KV_NAMESPACE = "hbmserve"


def _decision_key(app: str | None, deployment: str) -> str:
    return f"autoscale/{app or '-'}/{deployment}"


def _history_key(app: str | None, deployment: str) -> str:
    return f"autoscale-log/{app or '-'}/{deployment}"


def _envelope_key(app: str | None, deployment: str) -> str:
    return f"autoscale-envelope/{app or '-'}/{deployment}"


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
    "hbmserve_autoscale_burst_hold_replicas": "Replicas the burst envelope holds through lulls",
    "hbmserve_autoscale_not_in_time_replicas": "Replicas not ordered: they would arrive after the burst",
    "hbmserve_autoscale_prior_hold_replicas": "Replicas the autoscaling prior alone holds before any traffic",
}


# The head word of a decision's reason (autoscale/stages.py `Outcome.action`).
ACTIONS = ("up", "down", "hold")


def decision_roles(decision: DecisionRecord) -> ReplicaRoles:
    """Replicas by role as one decision sees them: the running ones are its active and standby
    lists; below its Serve target the rest are starting, above it the surplus (out of rotation,
    to be stopped by Serve) is draining; warm is the warm pool the policy sized."""
    running = len(decision.active_replicas) + len(decision.standby_replicas)
    draining = max(0, running - decision.serve_target)
    return ReplicaRoles(starting=max(0, decision.serve_target - running), active=len(decision.active_replicas),
                        standby=max(0, len(decision.standby_replicas) - draining), draining=draining,
                        warm=decision.target_standby.get(Tier.WARM, 0))


def decision_action(decision: DecisionRecord) -> str:
    head = decision.reason.split(" ", 1)[0].rstrip(":")
    return head if head in ACTIONS else "other"


# Decisions kept for the dashboard's log: only those that changed the plan, so a steady hour
# of "hold" ticks does not push out the scale-up that explains it.
DECISION_HISTORY = 50


def with_history(history: list[Any], decision: DecisionRecord, limit: int = DECISION_HISTORY) -> list[Any]:
    """The stored history (plain JSON data, oldest first) with `decision` appended, the oldest
    dropped past `limit`."""
    return [*history, decision.to_dict()][-limit:]


class DecisionLog:
    """Publishes one policy's decisions; owns its gauges (one instance per policy object).

    Besides the gauges above: `hbmserve_replicas{role}` (decision_roles) and
    `hbmserve_autoscale_last_action{action}`, 1 for the last decision's action and 0 for the
    others (a label per full reason would grow without bound; the reason is in `hbmserve status`)."""

    def __init__(self) -> None:
        self._gauges: dict[str, Any] = {}

    def publish(self, app: str | None, deployment: str, decision: DecisionRecord, changed: bool = True) -> None:
        """`changed`: the decision changed the plan (the policy logs it); it joins the history."""
        from ray.experimental import internal_kv
        from ray.util.metrics import Gauge

        if internal_kv._internal_kv_initialized():
            internal_kv._internal_kv_put(_decision_key(app, deployment), decision.to_json(), overwrite=True,
                                         namespace=KV_NAMESPACE)
            if changed:
                key = _history_key(app, deployment)
                raw = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
                try:
                    history = json.loads(raw) if raw else []
                except ValueError:
                    history = []  # unreadable: start again rather than stop logging
                history = with_history(history if isinstance(history, list) else [], decision)
                internal_kv._internal_kv_put(key, json.dumps(history), overwrite=True, namespace=KV_NAMESPACE)
        values = {
            "hbmserve_autoscale_target_replicas": decision.serve_target,
            "hbmserve_autoscale_active_replicas": len(decision.active_replicas),
            "hbmserve_autoscale_standby_replicas": len(decision.standby_replicas),
            "hbmserve_autoscale_held_requests": decision.held_at_ingress,
            "hbmserve_autoscale_refused_rps": decision.refused_rps_at_ingress,
            "hbmserve_autoscale_burst_hold_replicas": decision.burst_hold,
            "hbmserve_autoscale_not_in_time_replicas": decision.not_in_time,
            "hbmserve_autoscale_prior_hold_replicas": decision.prior_hold,
        }
        tags = {"application": app or "-", "deployment": deployment}
        for name, description in _GAUGES.items():
            if name not in self._gauges:
                self._gauges[name] = Gauge(name, description, tag_keys=("application", "deployment"))
            self._gauges[name].set(values[name], tags=tags)
        self._labelled("hbmserve_replicas", "Replicas of the deployment by role", "role",
                       decision_roles(decision).to_dict(), tags)
        action = decision_action(decision)
        self._labelled("hbmserve_autoscale_last_action", "1 for the action of the policy's last decision",
                       "action", {a: float(a == action) for a in (*ACTIONS, "other")}, tags)

    def _labelled(self, name: str, description: str, key: str, values: dict[str, float], tags: dict[str, str]):
        from ray.util.metrics import Gauge

        if name not in self._gauges:
            self._gauges[name] = Gauge(name, description, tag_keys=("application", "deployment", key))
        for label, value in values.items():
            self._gauges[name].set(value, tags={**tags, key: label})


def latest_decision(app: str | None, deployment: str) -> DecisionRecord | None:
    """The last decision for a deployment, or None if its policy never ran (fixed replicas)."""
    from ray.experimental import internal_kv

    key = _decision_key(app, deployment)
    raw = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
    return DecisionRecord.from_json(raw, source=f"Ray KV {KV_NAMESPACE}/{key}") if raw else None


def recent_decisions(app: str | None, deployment: str) -> tuple[DecisionRecord, ...]:
    """The last DECISION_HISTORY plan-changing decisions, oldest first; entries this version cannot
    read are skipped (the log is for people; one odd entry must not hide the rest)."""
    key = _history_key(app, deployment)
    raw = _kv()._internal_kv_get(key, namespace=KV_NAMESPACE)
    try:
        history = json.loads(raw) if raw else []
    except ValueError:
        return ()
    out = []
    for entry in history if isinstance(history, list) else []:
        try:
            out.append(DecisionRecord.from_dict(entry, source=f"Ray KV {KV_NAMESPACE}/{key}"))
        except RecordError:
            continue
    return tuple(out)


def save_envelope(app: str | None, deployment: str, envelope: dict[str, Any]) -> None:
    """The autoscaler's burst envelope (autoscale/envelope.py, as plain data), kept past a
    controller restart or a redeploy (autoscale/memory/resume.py); nothing outside a Ray cluster."""
    if not _kv()._internal_kv_initialized():
        return
    _kv()._internal_kv_put(_envelope_key(app, deployment), json.dumps(envelope).encode(), overwrite=True,
                           namespace=KV_NAMESPACE)


def saved_envelope(app: str | None, deployment: str) -> dict[str, Any] | None:
    """What save_envelope kept last; None if nothing, or nothing this version can read."""
    if not _kv()._internal_kv_initialized():
        return None
    raw = _kv()._internal_kv_get(_envelope_key(app, deployment), namespace=KV_NAMESPACE)
    try:
        got = json.loads(raw) if raw else None
    except ValueError:
        return None
    return got if isinstance(got, dict) else None


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


WARM_TIER_KEY = "warm-tier"


def publish_warm_tier(record: WarmTierRecord) -> None:
    _kv()._internal_kv_put(WARM_TIER_KEY, record.to_json(), overwrite=True, namespace=KV_NAMESPACE)


def latest_warm_tier(now: float | None = None) -> WarmTierRecord | None:
    """The warm-tier aggregator's last renewal, or None when it does not run (never started,
    stopped, or not renewed within TTL_S); none outside a Ray cluster."""
    if not _kv()._internal_kv_initialized():
        return None
    raw = _kv()._internal_kv_get(WARM_TIER_KEY, namespace=KV_NAMESPACE)
    record = WarmTierRecord.from_json(raw, source=f"Ray KV {KV_NAMESPACE}/{WARM_TIER_KEY}") if raw else None
    now = time.time() if now is None else now
    return record if record is not None and now - record.at <= TTL_S else None


DEPLOYED_KEY = "deployed"


def publish_deployed(record: DeployedRecord) -> None:
    _kv()._internal_kv_put(DEPLOYED_KEY, record.to_json(), overwrite=True, namespace=KV_NAMESPACE)


def latest_deployed() -> DeployedRecord | None:
    """What the last deploy left, None before the first (or after `down`)."""
    raw = _kv()._internal_kv_get(DEPLOYED_KEY, namespace=KV_NAMESPACE)
    return DeployedRecord.from_json(raw, source=f"Ray KV {KV_NAMESPACE}/{DEPLOYED_KEY}") if raw else None


def forget_deployed() -> None:
    kv = _kv()
    kv._internal_kv_del(DEPLOYED_KEY, namespace=KV_NAMESPACE)
    kv._internal_kv_del("rollout/", del_by_prefix=True, namespace=KV_NAMESPACE)


def publish_rollout(record: RolloutRecord) -> None:
    _kv()._internal_kv_put(f"rollout/{record.model}", record.to_json(), overwrite=True, namespace=KV_NAMESPACE)


def rollouts() -> list[RolloutRecord]:
    """Each model's last rollout, running or ended (malformed ones skipped); none outside Ray."""
    kv = _kv()
    if not kv._internal_kv_initialized():
        return []
    out = []
    for key in kv._internal_kv_list("rollout/", namespace=KV_NAMESPACE):
        raw = kv._internal_kv_get(key, namespace=KV_NAMESPACE)
        if not raw:
            continue
        try:
            out.append(RolloutRecord.from_json(raw, source=f"Ray KV {KV_NAMESPACE}/{key!r}"))
        except RecordError:
            continue
    return sorted(out, key=lambda r: r.model)


def info_reply(info: ReplicaInfo | IngressInfo) -> dict[str, Any]:
    """What an `info()` Serve method returns: the record as plain JSON data."""
    return info.to_dict()


def read_replica_info(reply: Any) -> ReplicaInfo:
    """An engine replica's `info()` reply, typed."""
    return ReplicaInfo.from_dict(reply, source="a replica's info() reply")


def read_ingress_info(reply: Any) -> IngressInfo:
    """A front door's `info()` reply, typed."""
    return IngressInfo.from_dict(reply, source="a front door's info() reply")
