"""Ray Serve 2.60 custom autoscaling policy around hbmserve's pure `decide`.

Three pieces, all thin:

* `autoscaling_stats(...)`: what the engine deployment's `record_autoscaling_stats()` returns
  (Serve requires dict[str, int | float]); the names are defined here, once.
* `snapshot_from_context(ctx, ...)` and `decide_from_context(ctx, config, held)`:
  AutoscalingContext -> Snapshot -> decide -> roles (roles.py) -> Serve's answer. They read
  only attributes (duck-typed), so they need no Ray import. Before deciding, the config takes
  the warm start-up the replicas measured (`with_measured_startup`) and the replica capacity the
  capacity model gives for the request lengths they report (`with_observed_capacity`).
* `HbmServeAutoscalingPolicy`: the callable Serve instantiates with `policy_kwargs` (the
  AutoscaleConfig fields) and calls as `(AutoscalingContext) -> (target_replicas, policy_state)`.
  Serve replicas = active target + hot standbys. Which replicas are active is decided here
  (roles.py: surplus actives demoted least-loaded first) and published with the decision
  (records_store.py); replicas follow it, binding or releasing the model's port, so a standby
  gets no traffic until promoted. The warm-pool target travels in the decision record to the
  warm-tier aggregator (warm_tier.py), which asks Ray's node autoscaler for the nodes; it is
  kept at 0, with the reason, while that cannot happen (autoscale/warm_nodes.py
  `live_warm_target`). Every decision is logged with its reason.

`serve_autoscaling_config(config)` gives the AutoscalingConfig kwargs that make this the only
hysteresis in the loop: Serve wraps every custom policy in its own delay logic
(autoscaling_policy.py _apply_autoscaling_config), so its delays are set to 0 here. What
Serve still adds: min/max bounds, its cold-start fast path (0 running replicas and a queued
request -> 1 replica without asking the policy), and a scale-down to 0 only from 1
(_apply_delay_logic), so N -> 0 takes two control-loop ticks.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from dataclasses import asdict
from typing import Any, Collection, Iterable, Mapping

from hbmserve.autoscale.policy import AutoscaleConfig, PolicyState, decide
from hbmserve.autoscale.roles import age_order, assign_roles, current_active
from hbmserve.autoscale.slots import leaving
from hbmserve.autoscale.signals import p95
from hbmserve.capacity.length_capacity import CapacityTable, LengthStats
from hbmserve.core.config import ModelSpec
from hbmserve.autoscale.warm_nodes import live_warm_target
from hbmserve.core.records import DecisionRecord, IngressDemand, RecordError, WarmTierRecord
from hbmserve.core.scaling import ReplicaSnapshot, ReplicaState, Snapshot, Tier
from hbmserve.deployments.records_store import TTL_S, DecisionLog, ingress_demand, latest_warm_tier

STAT_WAITING = "hbm_waiting"
STAT_RUNNING = "hbm_running"
STAT_KV_USAGE = "hbm_kv_usage"
STAT_TTFT_P95_S = "hbm_ttft_p95_s"  # the replica's p95 TTFT over its own recent window
STAT_TPOT_P95_S = "hbm_tpot_p95_s"  # p95 of its streamed requests' time per output token
STAT_ARRIVAL_RPS = "hbm_arrival_rps"  # requests/s the replica received over the window
STAT_LOAD_S = "hbm_load_s"  # seconds the replica took from its constructor to a loaded engine
STAT_WAKE_S = "hbm_wake_s"  # seconds its last wake from sleep mode took (standby_sleep.py); absent: none
# Mean prompt and output tokens of the requests the replica finished over its window, and how many.
STAT_PROMPT_TOKENS = "hbm_prompt_tokens_mean"
STAT_OUTPUT_TOKENS = "hbm_output_tokens_mean"
STAT_LENGTH_SAMPLES = "hbm_length_samples"
# Fewer finished requests than this (over all replicas) leave the configured capacity in place.
MIN_LENGTH_SAMPLES = 20

POLICY_STATE_KEY = "hbmserve"
ROLES_KEY = "hbmserve_roles"
DECISION_KEY = "hbmserve_decision"
POLICY_PATH = "hbmserve.deployments.autoscaling:HbmServeAutoscalingPolicy"
# How often each replica pushes its stats to the controller. Ray 2.60 takes this from the
# (deprecated) AutoscalingConfig.metrics_interval_s, default 10 s, which left the policy up to
# 10 s behind a burst; the RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S variable its
# deprecation warning names is not read yet.
REPLICA_STATS_PUSH_S = 1.0


def autoscaling_stats(*, waiting: int, running: int, kv_usage: float,
                      ttft_samples_s: Iterable[float], tpot_samples_s: Iterable[float],
                      arrival_rps: float, load_s: float,
                      lengths: tuple[float, float, int] | None = None,
                      wake_s: float | None = None) -> dict[str, float]:
    """The body of an engine deployment's `record_autoscaling_stats()`. `lengths`: (mean prompt
    tokens, mean output tokens, requests) of the requests finished over the window. `wake_s`: the
    replica's last wake from sleep mode (None: it never woke)."""
    stats = {
        STAT_WAITING: float(waiting),
        STAT_RUNNING: float(running),
        STAT_KV_USAGE: float(kv_usage),
        STAT_ARRIVAL_RPS: float(arrival_rps),
        STAT_LOAD_S: float(load_s),
    }
    if wake_s is not None:
        stats[STAT_WAKE_S] = float(wake_s)
    if lengths is not None and lengths[2] > 0:
        stats.update({STAT_PROMPT_TOKENS: float(lengths[0]), STAT_OUTPUT_TOKENS: float(lengths[1]),
                      STAT_LENGTH_SAMPLES: float(lengths[2])})
    # No completed request, no latency: the key is simply absent.
    for key, samples in ((STAT_TTFT_P95_S, ttft_samples_s), (STAT_TPOT_P95_S, tpot_samples_s)):
        value = p95(tuple(samples))
        if value is not None:
            stats[key] = value
    return stats


def replica_key(replica_id: Any) -> str:
    return str(getattr(replica_id, "unique_id", replica_id))


def _latest(ctx: Any, name: str, replica_id: Any) -> float | None:
    series = (ctx.raw_metrics or {}).get(name, {}).get(replica_id)
    if series:
        return float(series[-1].value)
    aggregated = (ctx.aggregated_metrics or {}).get(name, {}).get(replica_id)
    return None if aggregated is None else float(aggregated)


def _window(ctx: Any, name: str, replica_id: Any, since: float) -> list[float]:
    series = (ctx.raw_metrics or {}).get(name, {}).get(replica_id) or []
    return [float(p.value) for p in series if p.timestamp >= since]


def snapshot_from_context(ctx: Any, look_back_s: float, active: Collection[str] | None = None,
                          demand: IngressDemand | None = None) -> Snapshot:
    """Build the policy's view from a Serve AutoscalingContext.

    Per replica: the latest reported value of each stat; ACTIVE if in `active` (the roles the
    policy assigned; None: all of them), else a hot STANDBY. Latency samples: every per-replica
    p95 reported inside the look-back window by active replicas (the p95 of those approximates
    the fleet's p95 from above). STARTING: replicas Serve targets but does not yet run.
    `demand`: what the front doors saw that no replica did: the requests they hold (queued for
    a replica) and the rate they refused for capacity, which is added to the arrival rate (the
    simulator's rate counts every arrival, refused ones included).
    Not ctx.total_queued_requests: hbmserve's requests never pass through Serve handles (the
    replicas serve HTTP themselves), so Serve's handle queue holds only control-plane calls.
    """
    now = ctx.current_time if ctx.current_time is not None else time.time()
    since = now - look_back_s
    replicas: list[ReplicaSnapshot] = []
    ttft: list[float] = []
    tpot: list[float] = []
    arrival = 0.0
    for rid in ctx.running_replicas:
        key = replica_key(rid)
        serving = active is None or key in active
        replicas.append(ReplicaSnapshot(
            replica_id=key,
            state=ReplicaState.ACTIVE if serving else ReplicaState.STANDBY,
            waiting=round(_latest(ctx, STAT_WAITING, rid) or 0.0),
            running=round(_latest(ctx, STAT_RUNNING, rid) or 0.0),
            kv_usage=_latest(ctx, STAT_KV_USAGE, rid) or 0.0,
        ))
        if serving:
            arrival += _latest(ctx, STAT_ARRIVAL_RPS, rid) or 0.0
            ttft.extend(_window(ctx, STAT_TTFT_P95_S, rid, since))
            tpot.extend(_window(ctx, STAT_TPOT_P95_S, rid, since))
    if demand is not None:
        arrival += demand.refused_rps
    for i in range(max(0, ctx.target_num_replicas - ctx.current_num_replicas)):
        replicas.append(ReplicaSnapshot(replica_id=f"starting-{i}", state=ReplicaState.STARTING))
    return Snapshot(now=float(now), replicas=tuple(replicas), ttft_samples_s=tuple(ttft),
                    tpot_samples_s=tuple(tpot), arrival_rate_rps=arrival,
                    pending_at_ingress=demand.held if demand else 0)


def serve_target(target_active: int, target_standby: dict[Tier, int]) -> int:
    """Serve replicas to run: the active ones plus the hot standbys (loaded engines)."""
    return target_active + target_standby.get(Tier.HOT, 0)


def with_measured_startup(config: AutoscaleConfig, ctx: Any, promote_s: float | None = None) -> AutoscaleConfig:
    """The config with its warm (and a sleeping pool's hot) start-up replaced by what this
    deployment's replicas measured.

    A new replica of a running deployment lands on a node that is up, with the weights on its
    disk after the first load: the warm tier. Each replica reports how long its engine took to
    load; the median of the running ones is the policy's warm start-up (kept between the hot
    and cold figures). `promote_s`: given for a model whose standbys sleep (the start-up model's
    promotion, capacity/startup_measured.py); the hot tier is then the median of the wakes the
    replicas measured plus that promotion (startup_timeline.py: wake, then promotion), in place
    of the assumed wake, and never above the warm tier. Without reports, the configured figures stand.
    """
    def median_of(stat: str) -> float | None:
        values = [v for v in (_latest(ctx, stat, rid) for rid in ctx.running_replicas) if v is not None]
        return statistics.median(values) if values else None

    wake = median_of(STAT_WAKE_S) if promote_s is not None else None
    load = median_of(STAT_LOAD_S)
    if wake is None and load is None:
        return config
    hot = config.startup_hot_s if wake is None else wake + promote_s
    warm = config.startup_warm_s if load is None else min(max(load, hot), config.startup_cold_s)
    return dataclasses.replace(config, startup_hot_s=min(hot, warm), startup_warm_s=warm)


def observed_lengths(ctx: Any) -> LengthStats | None:
    """Mean prompt and output lengths over what the running replicas finished in their windows,
    weighted by requests; None below MIN_LENGTH_SAMPLES requests."""
    total = prompt = output = 0.0
    for rid in ctx.running_replicas:
        n = _latest(ctx, STAT_LENGTH_SAMPLES, rid) or 0.0
        p, o = _latest(ctx, STAT_PROMPT_TOKENS, rid), _latest(ctx, STAT_OUTPUT_TOKENS, rid)
        if n > 0 and p is not None and o is not None:
            total, prompt, output = total + n, prompt + n * p, output + n * o
    if total < MIN_LENGTH_SAMPLES:
        return None
    return LengthStats(prompt / total, output / total)


def with_observed_capacity(config: AutoscaleConfig, ctx: Any,
                           capacity: CapacityTable | None) -> AutoscaleConfig:
    """The config with `replica_capacity_rps` re-estimated by the capacity model for the request
    lengths the replicas report (capacity/length_capacity.py). The configured figure, planned
    for another mix or typed, stands until enough requests have finished, when the model has no
    table for this deployment, or when it says no rate meets the SLO at these lengths."""
    lengths = observed_lengths(ctx) if capacity is not None else None
    if lengths is None or capacity is None:
        return config
    rps = capacity.rps_at(lengths.prompt_mean, lengths.output_mean)
    return dataclasses.replace(config, replica_capacity_rps=rps) if rps > 0 else config


def decide_from_context(ctx: Any, config: AutoscaleConfig, demand: IngressDemand | None = None,
                        capacity: CapacityTable | None = None,
                        warm_tier: WarmTierRecord | None = None,
                        slot_of: Mapping[str, int] | None = None,
                        promote_s: float | None = None) -> tuple[int, dict[str, Any]]:
    """The whole translation, context in, Serve's answer out; no logging, no I/O.

    `warm_tier`: the warm-tier aggregator's last record (None: none runs, so no warm node is
    kept). `slot_of`: replica id -> planned slot, for a model that runs one deployment per slot
    (slot_autoscaling.py). Serve then stops the replicas in the slots at or above the new
    target (autoscale/slots.py), so the roles are assigned among the others and the leaving
    ones are out of rotation at once. `promote_s`: a sleeping pool's promotion
    (`with_measured_startup`)."""
    config = with_observed_capacity(with_measured_startup(config, ctx, promote_s), ctx, capacity)
    prior_state = ctx.policy_state or {}
    prior = prior_state.get(POLICY_STATE_KEY)
    state = PolicyState.from_dict(prior) if prior else PolicyState()
    roles = prior_state.get(ROLES_KEY) or {}
    running = [replica_key(r) for r in ctx.running_replicas]
    order = age_order(running, roles.get("order", ()))
    serving = current_active(order, roles.get("active"))
    snapshot = snapshot_from_context(ctx, config.look_back_s, serving, demand)
    decision, state = decide(snapshot, config, state)
    # Surplus actives are demoted least-loaded first (roles.scale_down_victims, as the
    # simulator drains them); which replica Serve then stops is Serve's choice (see roles.py).
    in_flight = {r.replica_id: r.waiting + r.running for r in snapshot.replicas}
    gone = leaving(slot_of, serve_target(decision.target_active, decision.target_standby)) if slot_of else frozenset()
    assignment = assign_roles([r for r in running if r not in gone], order, roles.get("active"),
                              decision.target_active, in_flight)
    reason = decision.reason
    standby = dict(decision.target_standby)
    standby[Tier.WARM], why_not_warm = live_warm_target(
        standby.get(Tier.WARM, 0), getattr(ctx, "deployment_name", ""), warm_tier, snapshot.now, TTL_S)
    if why_not_warm:
        reason = f"{reason}; {why_not_warm}"
    if assignment.describe():
        reason = f"{reason}; {assignment.describe()}"
    policy_state = dict(prior_state)
    policy_state[POLICY_STATE_KEY] = state.to_dict()
    policy_state[ROLES_KEY] = {"order": list(assignment.order), "active": list(assignment.active)}
    record = DecisionRecord(
        at=snapshot.now,
        target_active=decision.target_active,
        target_standby=standby,
        active_replicas=tuple(assignment.active),
        standby_replicas=tuple(assignment.standby),
        held_at_ingress=demand.held if demand else 0,
        refused_rps_at_ingress=demand.refused_rps if demand else 0.0,
        startup_s=dict(config.startup_s),
        reason=reason,
        serve_target=serve_target(decision.target_active, decision.target_standby),
    )
    # Serve keeps policy_state between calls and wants plain data: the record's JSON form.
    policy_state[DECISION_KEY] = record.to_dict()
    return record.serve_target, policy_state


def decision_in(policy_state: dict[str, Any] | None) -> DecisionRecord | None:
    """The decision record `decide_from_context` left in a policy_state, typed."""
    raw = (policy_state or {}).get(DECISION_KEY)
    return DecisionRecord.from_dict(raw, source="Serve policy_state") if raw else None


def _plan(decision: DecisionRecord) -> tuple:
    """What a decision changes in the cluster; a new plan is logged, a repeated one is not."""
    return decision.target_active, dict(decision.target_standby), decision.active_replicas


class HbmServeAutoscalingPolicy:
    """What `AutoscalingPolicy(policy_function=POLICY_PATH, policy_kwargs=...)` builds."""

    def __init__(self, capacity_by_length: dict[str, Any] | None = None, promote_s: float | None = None,
                 **config_fields: Any) -> None:
        self.config = AutoscaleConfig.from_dict(config_fields)
        self.capacity = CapacityTable.from_dict(capacity_by_length) if capacity_by_length else None
        self.promote_s = promote_s  # set for a model whose standbys sleep (with_measured_startup)
        self._log = logging.getLogger("ray.serve")
        self._decisions = DecisionLog()

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        return self.step(ctx, getattr(ctx, "deployment_name", "?"))

    def step(self, ctx: Any, deployment: str,
             slot_of: Mapping[str, int] | None = None) -> tuple[int, dict[str, Any]]:
        """Decide for `deployment`'s replicas in `ctx`, log a changed plan, publish the record
        under `deployment` (the model's engine deployment, also for a slotted model)."""
        app = getattr(ctx, "app_name", None)
        try:
            warm_tier = latest_warm_tier()
        except RecordError:  # another hbmserve version's aggregator: keep no warm pool, as with none
            warm_tier = None
        target, policy_state = decide_from_context(ctx, self.config, ingress_demand(app, deployment),
                                                   self.capacity, warm_tier, slot_of, self.promote_s)
        decision = decision_in(policy_state)
        try:
            previous = decision_in(ctx.policy_state)
        except RecordError:  # left by another hbmserve version: only the log line depends on it
            previous = None
        changed = previous is None or _plan(previous) != _plan(decision)
        if changed:
            self._log.info("hbmserve autoscale %s: serve replicas %d; %s", deployment, target,
                           decision.reason)
        # The replicas follow `active_replicas` from this record: publish every tick, so a
        # restarted replica or controller converges without waiting for a change.
        self._decisions.publish(app, deployment, decision, changed=changed)
        return target, policy_state


def live_startup(model: ModelSpec) -> dict[Tier, float] | None:
    """The start-up model's seconds per tier for `model` (capacity/startup_measured.py), for a
    config that states none; None when the capacity model does not know its GPU or shape: the
    schema's defaults then stand."""
    from hbmserve.capacity.hardware import load_catalog
    from hbmserve.capacity.scenario import scenario_for
    from hbmserve.capacity.startup_measured import startup_estimate

    try:
        return startup_estimate(model, scenario_for(model, load_catalog()).deployment.gpu)
    except (ValueError, OSError):  # as live_capacity: the model unknown to the catalog
        return None


def live_promote_s(model: ModelSpec) -> float | None:
    """The start-up model's promotion for a model whose standbys sleep, added to the wakes its
    replicas measure (`with_measured_startup`); None for any other model, or when the start-up
    model has nothing for it (the configured hot start-up then stands)."""
    from hbmserve.capacity.hardware import load_catalog
    from hbmserve.capacity.scenario import scenario_for
    from hbmserve.capacity.startup_measured import startup_inputs_for

    if not model.standbys_sleep:
        return None
    try:
        return startup_inputs_for(model, scenario_for(model, load_catalog()).deployment.gpu).promote_s
    except (ValueError, OSError):  # as live_startup
        return None


def live_capacity(model: ModelSpec) -> tuple[CapacityTable | None, float | None]:
    """The capacity model's replica capacity by request length and TPOT floor for `model`, built
    where the config is (its files are here, not in Serve's controller); (None, None) when the
    capacity model does not know its GPU or shape: the policy then runs on the configured figure."""
    from hbmserve.capacity.hardware import load_catalog
    from hbmserve.capacity.length_capacity import capacity_table
    from hbmserve.capacity.perf_model import cost_model
    from hbmserve.capacity.scenario import knobs_of, scenario_for, tpot_floor_s

    try:
        sc = scenario_for(model, load_catalog())
    except (ValueError, OSError):  # ScenarioError, CatalogError, ModelConfigError: all ValueErrors
        return None, None
    table = capacity_table(cost_model(sc.deployment), knobs_of(sc), sc.slo_ttft_s, sc.slo_tpot_s)
    return table, tpot_floor_s(sc)


def serve_autoscaling_config(config: AutoscaleConfig, capacity: CapacityTable | None = None,
                             promote_s: float | None = None) -> dict[str, Any]:
    """Kwargs for ray.serve.config.AutoscalingConfig running this policy. `promote_s`: for a model
    whose standbys sleep (`live_promote_s`)."""
    return {
        "min_replicas": config.min_replicas,
        # Standbys only fill room under max_replicas (warm_pool.size_pool), so active + hot
        # never exceeds it.
        "max_replicas": config.max_replicas,
        "look_back_period_s": config.look_back_s,
        "metrics_interval_s": min(REPLICA_STATS_PUSH_S, config.look_back_s / 2),
        "upscale_delay_s": 0.0,
        "downscale_delay_s": 0.0,
        "downscale_to_zero_delay_s": 0.0,
        "policy": {"policy_function": POLICY_PATH, "policy_kwargs": {
            **asdict(config), **({"capacity_by_length": capacity.to_dict()} if capacity else {}),
            **({"promote_s": promote_s} if promote_s is not None else {})}},
    }
