"""Ray Serve 2.60 custom autoscaling policy around hbmserve's pure `decide`.

Three pieces, all thin:

* `autoscaling_stats(...)`: what the engine deployment's `record_autoscaling_stats()` returns
  (Serve requires dict[str, int | float]); the names are defined here, once.
* `snapshot_from_context(ctx, look_back_s)`: AutoscalingContext -> Snapshot. It reads only
  attributes (duck-typed), so it needs no Ray import.
* `HbmServeAutoscalingPolicy`: the callable Serve instantiates with `policy_kwargs` (the
  AutoscaleConfig fields) and calls as `(AutoscalingContext) -> (target_replicas, policy_state)`.
  Serve replicas = active target + hot standbys (standbys are loaded replicas that the router
  must skip until promoted). Warm and cold pool targets travel in policy_state for the
  node-pool executor, and every decision is logged with its reason.

`serve_autoscaling_config(config)` gives the AutoscalingConfig kwargs that make this the only
hysteresis in the loop: Serve wraps every custom policy in its own delay logic
(autoscaling_policy.py _apply_autoscaling_config), so its delays are set to 0 here. What
Serve still adds: min/max bounds, its cold-start fast path (0 running replicas and a queued
request -> 1 replica without asking the policy), and a scale-down to 0 only from 1
(_apply_delay_logic), so N -> 0 takes two control-loop ticks.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict
from typing import Any, Iterable

from hbmserve.autoscale.policy import AutoscaleConfig, PolicyState, decide
from hbmserve.autoscale.signals import p95
from hbmserve.autoscale.types import ReplicaSnapshot, ReplicaState, Snapshot, Tier

STAT_WAITING = "hbm_waiting"
STAT_RUNNING = "hbm_running"
STAT_KV_USAGE = "hbm_kv_usage"
STAT_TTFT_P95_S = "hbm_ttft_p95_s"  # the replica's p95 TTFT over its own recent window
STAT_ARRIVAL_RPS = "hbm_arrival_rps"  # requests/s the replica received over the window
STAT_STANDBY = "hbm_standby"  # 1.0 while a hot standby (loaded, not routed to)
STAT_PENDING = "hbm_pending"  # requests held at hbmserve's ingress, waiting for any replica

POLICY_STATE_KEY = "hbmserve"
DECISION_KEY = "hbmserve_decision"
POLICY_PATH = "hbmserve.autoscale.serve_adapter:HbmServeAutoscalingPolicy"


def autoscaling_stats(*, waiting: int, running: int, kv_usage: float,
                      ttft_samples_s: Iterable[float], arrival_rps: float,
                      standby: bool) -> dict[str, float]:
    """The body of an engine deployment's `record_autoscaling_stats()`."""
    stats = {
        STAT_WAITING: float(waiting),
        STAT_RUNNING: float(running),
        STAT_KV_USAGE: float(kv_usage),
        STAT_ARRIVAL_RPS: float(arrival_rps),
        STAT_STANDBY: 1.0 if standby else 0.0,
    }
    ttft = p95(tuple(ttft_samples_s))
    if ttft is not None:  # no completed request, no TTFT: the key is simply absent
        stats[STAT_TTFT_P95_S] = ttft
    return stats


def _replica_key(replica_id: Any) -> str:
    return str(getattr(replica_id, "unique_id", replica_id))


def _latest(ctx: Any, name: str, replica_id: Any) -> float | None:
    series = (ctx.raw_metrics or {}).get(name, {}).get(replica_id)
    if series:
        return float(series[-1].value)
    aggregated = (ctx.aggregated_metrics or {}).get(name, {}).get(replica_id)
    return None if aggregated is None else float(aggregated)


def snapshot_from_context(ctx: Any, look_back_s: float) -> Snapshot:
    """Build the policy's view from a Serve AutoscalingContext.

    Per replica: the latest reported value of each stat. TTFT samples: every per-replica p95
    reported inside the look-back window (the p95 of those approximates the fleet's p95 from
    above). STARTING: replicas Serve targets but does not yet run. Requests queued at
    held at hbmserve's ingress (STAT_PENDING) are the ingress backlog.
    """
    now = ctx.current_time if ctx.current_time is not None else time.time()
    replicas: list[ReplicaSnapshot] = []
    ttft: list[float] = []
    arrival = 0.0
    for rid in ctx.running_replicas:
        standby = (_latest(ctx, STAT_STANDBY, rid) or 0.0) >= 0.5
        replicas.append(ReplicaSnapshot(
            replica_id=_replica_key(rid),
            state=ReplicaState.STANDBY if standby else ReplicaState.ACTIVE,
            waiting=round(_latest(ctx, STAT_WAITING, rid) or 0.0),
            running=round(_latest(ctx, STAT_RUNNING, rid) or 0.0),
            kv_usage=_latest(ctx, STAT_KV_USAGE, rid) or 0.0,
        ))
        if standby:
            continue
        arrival += _latest(ctx, STAT_ARRIVAL_RPS, rid) or 0.0
        series = (ctx.raw_metrics or {}).get(STAT_TTFT_P95_S, {}).get(rid) or []
        ttft.extend(float(p.value) for p in series if p.timestamp >= now - look_back_s)
    for i in range(max(0, ctx.target_num_replicas - ctx.current_num_replicas)):
        replicas.append(ReplicaSnapshot(replica_id=f"starting-{i}", state=ReplicaState.STARTING))
    # Not ctx.total_queued_requests: hbmserve's requests never pass through Serve handles (the
    # replicas serve HTTP themselves), so Serve's handle queue holds only control-plane calls
    # such as `hbmserve status` probes, which must not look like user demand.
    queued = max((_latest(ctx, STAT_PENDING, rid) or 0.0 for rid in ctx.running_replicas), default=0.0)
    return Snapshot(now=float(now), replicas=tuple(replicas), ttft_samples_s=tuple(ttft),
                    arrival_rate_rps=arrival, pending_at_ingress=math.ceil(queued))


def serve_target(target_active: int, target_standby: dict[Tier, int]) -> int:
    """Serve replicas to run: the active ones plus the hot standbys (loaded engines)."""
    return target_active + target_standby.get(Tier.HOT, 0)


def decide_from_context(ctx: Any, config: AutoscaleConfig) -> tuple[int, dict[str, Any]]:
    """The whole translation, context in, Serve's answer out; no logging."""
    prior = (ctx.policy_state or {}).get(POLICY_STATE_KEY)
    state = PolicyState.from_dict(prior) if prior else PolicyState()
    snapshot = snapshot_from_context(ctx, config.look_back_s)
    decision, state = decide(snapshot, config, state)
    policy_state = dict(ctx.policy_state or {})
    policy_state[POLICY_STATE_KEY] = state.to_dict()
    policy_state[DECISION_KEY] = {
        "at": snapshot.now,
        "target_active": decision.target_active,
        "target_standby": {t.value: n for t, n in decision.target_standby.items()},
        "reason": decision.reason,
    }
    return serve_target(decision.target_active, decision.target_standby), policy_state


class HbmServeAutoscalingPolicy:
    """What `AutoscalingPolicy(policy_function=POLICY_PATH, policy_kwargs=...)` builds."""

    def __init__(self, **config_fields: Any) -> None:
        from hbmserve.autoscale.decision_log import DecisionLog

        self.config = AutoscaleConfig.from_dict(config_fields)
        self._log = logging.getLogger("ray.serve")
        self._decisions = DecisionLog()

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        target, policy_state = decide_from_context(ctx, self.config)
        previous = (ctx.policy_state or {}).get(DECISION_KEY) or {}
        decision = policy_state[DECISION_KEY]
        if (previous.get("target_active"), previous.get("target_standby")) != (
                decision["target_active"], decision["target_standby"]):
            self._log.info("hbmserve autoscale %s: serve replicas %d; %s",
                           getattr(ctx, "deployment_name", "?"), target, decision["reason"])
        self._decisions.publish(getattr(ctx, "app_name", None), getattr(ctx, "deployment_name", "?"), target,
                                decision)
        return target, policy_state


def serve_autoscaling_config(config: AutoscaleConfig) -> dict[str, Any]:
    """Kwargs for ray.serve.config.AutoscalingConfig running this policy."""
    return {
        "min_replicas": config.min_replicas,
        # Standbys only fill room under max_replicas (warm_pool.size_pool), so active + hot
        # never exceeds it.
        "max_replicas": config.max_replicas,
        "look_back_period_s": config.look_back_s,
        "upscale_delay_s": 0.0,
        "downscale_delay_s": 0.0,
        "downscale_to_zero_delay_s": 0.0,
        "policy": {"policy_function": POLICY_PATH, "policy_kwargs": asdict(config)},
    }
