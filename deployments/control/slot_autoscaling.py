"""Autoscaling a model whose replicas the placement planner places: one Serve deployment per
planned slot, and one policy decision for all of them.

The design, and why. The planner plans `autoscaling.max_replicas` replicas up front (so a config
whose ceiling does not fit the topology is refused before anything starts, with the planner's
alternatives), and each planned replica becomes a slot: its own deployment
(`engine-<model>-r<k>`, placed_app.py) whose placement group is pinned to the slot's island, with
a replica count of 0 or 1. Replica k therefore lands on slot k's island and verifies it exactly
like a fixed planned replica. The alternatives weighed, on Ray 2.60:

* One deployment whose replicas claim a free slot at start: Serve builds a replica's placement
  group from the deployment's options *before* the replica runs, one set of bundles for every
  replica, so a replica cannot pick its island; a one-GPU vLLM replica holds its GPU in the
  actor itself, which would have to move.
* Serve's application-level autoscaling policy (`autoscaling_policy` in the application's
  config; one call sees every deployment's context and sets each count) is the natural fit, but
  in Ray 2.60 it is reached only through a declarative config (ServeApplicationSchema; the
  schema itself says "under development"): `serve.run`, which `hbmserve deploy` uses, has no way
  to pass it (ApplicationArgs carries only `external_scaler_enabled`).
* The external scaler (`update_deployment_replicas`) sets counts from outside, but the policy's
  inputs (the replicas' pushed stats) live in the controller; an outside loop would not see them.

So each slot deployment runs `SlotAutoscalingPolicy`, a deployment-level policy like the one an
unplanned model runs. Every tick each slot publishes what its context holds (its replicas'
stats: records_store `publish_slot_stats`); slot 0 (always deployed, even at 0 replicas) leads:
it merges the fresh slot stats into one model-wide context (`model_context`, pure), runs the
unchanged policy on it (autoscaling.py `HbmServeAutoscalingPolicy.step`: `decide` and the roles)
and publishes the decision under the model's engine deployment name, exactly where an unplanned
model's decision is, so the front doors, the replicas' roles and `hbmserve status` read it as
before. Every slot answers Serve with its share of the decision's replica target
(autoscale/slots.py `slot_targets`: lowest slots first, so a scale-down stops the highest).
A follower acts on the leader's previous tick (Serve's control loop runs every 0.1 s).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hbmserve.autoscale.slots import slot_targets
from hbmserve.core.serve_context import PolicyContext
from hbmserve.core.records import SlotStats
from hbmserve.deployments.control.autoscaling import HbmServeAutoscalingPolicy, replica_key
from hbmserve.deployments.wire.records_store import latest_decision, publish_slot_stats, slot_stats

SLOT_POLICY_PATH = "hbmserve.deployments.control.slot_autoscaling:SlotAutoscalingPolicy"


@dataclass(frozen=True)
class Point:
    """One reported value, shaped like Serve's TimeStampedValue."""

    timestamp: float
    value: float


@dataclass(frozen=True)
class ModelContext:
    """The model-wide view the policy reads, merged from its slots: the attributes of Serve's
    AutoscalingContext that the adapters read: a `core.serve_context.PolicyContext`."""

    app_name: str | None
    deployment_name: str
    current_time: float
    running_replicas: tuple[str, ...]
    raw_metrics: Mapping[str, Mapping[str, list[Point]]]
    target_num_replicas: int
    current_num_replicas: int
    policy_state: dict[str, Any] = field(default_factory=dict)
    aggregated_metrics: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


def stats_of(ctx: PolicyContext, slot: int, look_back_s: float) -> SlotStats:
    """A slot's context as a SlotStats: per running replica, every stat's points inside the
    look-back window plus its latest (the policy reads both). Serve's aggregate stands in where
    no raw series was pushed."""
    now = ctx.current_time if ctx.current_time is not None else time.time()
    raw, aggregated = ctx.raw_metrics or {}, ctx.aggregated_metrics or {}
    replicas: dict[str, dict[str, tuple[tuple[float, float], ...]]] = {}
    for rid in ctx.running_replicas:
        stats: dict[str, tuple[tuple[float, float], ...]] = {}
        for name in set(raw) | set(aggregated):
            series = raw.get(name, {}).get(rid) or []
            points = [(float(p.timestamp), float(p.value)) for p in series]
            kept = [p for p in points[:-1] if p[0] >= now - look_back_s] + points[-1:]
            if not kept and aggregated.get(name, {}).get(rid) is not None:
                kept = [(float(now), float(aggregated[name][rid]))]
            if kept:
                stats[name] = tuple(kept)
        replicas[replica_key(rid)] = stats
    return SlotStats(at=float(now), slot=slot, target=ctx.target_num_replicas,
                     current=ctx.current_num_replicas, replicas=replicas)


def model_context(slots: Iterable[SlotStats], now: float, policy_state: dict[str, Any],
                  app: str | None, deployment: str) -> tuple[ModelContext, dict[str, int]]:
    """The slots merged into one context, and each running replica's slot (pure). A slot
    reported twice counts once, the newest report."""
    newest: dict[int, SlotStats] = {}
    for s in slots:
        if s.slot not in newest or s.at > newest[s.slot].at:
            newest[s.slot] = s
    raw: dict[str, dict[str, list[Point]]] = {}
    slot_of: dict[str, int] = {}
    for k in sorted(newest):
        for replica, stats in newest[k].replicas.items():
            slot_of[replica] = k
            for name, points in stats.items():
                raw.setdefault(name, {})[replica] = [Point(t, v) for t, v in points]
    ctx = ModelContext(app_name=app, deployment_name=deployment, current_time=now,
                       running_replicas=tuple(slot_of), raw_metrics=raw,
                       target_num_replicas=sum(s.target for s in newest.values()),
                       current_num_replicas=sum(s.current for s in newest.values()),
                       policy_state=policy_state)
    return ctx, slot_of


class SlotAutoscalingPolicy:
    """What Serve builds for each slot deployment of a planned, autoscaled model. `leader`: the
    model's HbmServeAutoscalingPolicy kwargs, given to slot 0 only."""

    def __init__(self, slot: int, slots: int, model_deployment: str, look_back_s: float,
                 leader: dict[str, Any] | None = None) -> None:
        self.slot, self.slots, self.model_deployment, self.look_back_s = slot, slots, model_deployment, look_back_s
        self.leader = HbmServeAutoscalingPolicy(**leader) if leader is not None else None

    def __call__(self, ctx: PolicyContext) -> tuple[int, dict[str, Any]]:
        app = ctx.app_name
        own = stats_of(ctx, self.slot, self.look_back_s)
        publish_slot_stats(app, self.model_deployment, own)
        if self.leader is None:
            decision = latest_decision(app, self.model_deployment)
            target = ctx.target_num_replicas if decision is None else decision.serve_target
            return slot_targets(target, self.slots)[self.slot], {}
        # This slot's own stats from the context itself, the others' from the store.
        others = [s for s in slot_stats(app, self.model_deployment, own.at) if s.slot != self.slot]
        merged, slot_of = model_context([own, *others], own.at, dict(ctx.policy_state or {}), app,
                                        self.model_deployment)
        target, policy_state = self.leader.step(merged, self.model_deployment, slot_of)
        return slot_targets(target, self.slots)[self.slot], policy_state
