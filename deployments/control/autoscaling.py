"""Ray Serve 2.60 custom autoscaling policy around hbmserve's pure `decide`.

Three pieces, all thin:

* The replicas' stats (`record_autoscaling_stats()`, deployments/wire/autoscaling_stats.py) arrive in
  Serve's AutoscalingContext, read through the `core.serve_context.PolicyContext` Protocol.
* `snapshot_from_context(ctx, ...)` and `decide_from_context(ctx, config, held)`:
  AutoscalingContext -> Snapshot -> decide -> roles (roles.py) -> Serve's answer. They read
  only attributes (duck-typed), so they need no Ray import. Before deciding, the config takes
  the warm start-up the replicas measured (`with_measured_startup`) and the replica capacity the
  capacity model gives for the request lengths they report (`with_observed_capacity`).
* `HbmServeAutoscalingPolicy`: the callable Serve instantiates with `policy_kwargs` (the
  AutoscaleConfig fields) and calls as `(AutoscalingContext) -> (target_replicas, policy_state)`.
  Serve replicas = active target + hot standbys. Which replicas are active is decided here
  (roles.py: surplus actives demoted least-loaded first) and published with the decision
  (deployments/wire/records_store.py); the front doors route only to the replicas it names active, so a
  standby keeps its engine loaded and its port open but gets no traffic until promoted. The warm-pool target travels in the decision record to the
  warm-tier aggregator (warm_tier.py), which asks Ray's node autoscaler for the nodes; it is
  kept at 0, with the reason, while that cannot happen (autoscale/warm_nodes.py
  `live_warm_target`). Every decision is logged with its reason.

The AutoscalingConfig that runs this policy is built with the other deployment options
(deployments/apps/autoscaling_options.py `serve_autoscaling_config`), with Serve's own delays at 0, so the
policy's hysteresis is the only one in the loop. What Serve still adds: min/max bounds, its cold-start fast path (0 running replicas and a queued
request -> 1 replica without asking the policy), and a scale-down to 0 only from 1
(_apply_delay_logic), so N -> 0 takes two control-loop ticks.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from typing import Any, Collection, Mapping

from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.policy import PolicyState, decide
from hbmserve.autoscale.memory.prior import prior_hold
from hbmserve.autoscale.memory.resume import resumed_envelope
from hbmserve.autoscale.roles import RoleAssignment, RolesState, age_order, assign_roles, current_active
from hbmserve.autoscale.slots import leaving
from hbmserve.capacity.perf.length_capacity import CapacityTable, LengthStats
from hbmserve.autoscale.warm_nodes import live_warm_target
from hbmserve.core.records import DecisionRecord, IngressDemand, RecordError, WarmTierRecord
from hbmserve.core.serve_context import PolicyContext
from hbmserve.core.scaling import ReplicaSnapshot, ReplicaState, ScaleDecision, Snapshot, Tier
from hbmserve.deployments.wire.autoscaling_stats import (STAT_ARRIVAL_RPS, STAT_KV_USAGE, STAT_LENGTH_SAMPLES, STAT_LOAD_S,
                                             STAT_OUTPUT_TOKENS, STAT_PROMPT_TOKENS, STAT_RUNNING, STAT_TPOT_P95_S,
                                             STAT_TTFT_P95_S, STAT_WAITING, STAT_WAKE_S)
from hbmserve.deployments.wire.records_store import (TTL_S, DecisionLog, ingress_demand, latest_warm_tier,
                                                    save_envelope, saved_envelope)

# Fewer finished requests than this (over all replicas) leave the configured capacity in place.
MIN_LENGTH_SAMPLES = 20

POLICY_STATE_KEY = "hbmserve"
# The burst envelope is saved to Ray's KV store this often at most (when it changed): a restart
# loses at most this much of a bucket's rise.
ENVELOPE_SAVE_S = 10.0
ROLES_KEY = "hbmserve_roles"
DECISION_KEY = "hbmserve_decision"
POLICY_PATH = "hbmserve.deployments.control.autoscaling:HbmServeAutoscalingPolicy"
# How often each replica pushes its stats to the controller. Ray 2.60 takes this from the
# (deprecated) AutoscalingConfig.metrics_interval_s, default 10 s, which left the policy up to
# 10 s behind a burst; the RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S variable its
# deprecation warning names is not read yet.
REPLICA_STATS_PUSH_S = 1.0


def replica_key(replica_id: Any) -> str:
    return str(getattr(replica_id, "unique_id", replica_id))


def _latest(ctx: PolicyContext, name: str, replica_id: Any) -> float | None:
    series = (ctx.raw_metrics or {}).get(name, {}).get(replica_id)
    if series:
        return float(series[-1].value)
    aggregated = (ctx.aggregated_metrics or {}).get(name, {}).get(replica_id)
    return None if aggregated is None else float(aggregated)


def _window(ctx: PolicyContext, name: str, replica_id: Any, since: float) -> list[float]:
    series = (ctx.raw_metrics or {}).get(name, {}).get(replica_id) or []
    return [float(p.value) for p in series if p.timestamp >= since]


def snapshot_from_context(ctx: PolicyContext, look_back_s: float, active: Collection[str] | None = None,
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


def with_measured_startup(config: AutoscaleConfig, ctx: PolicyContext, promote_s: float | None = None) -> AutoscaleConfig:
    """The config with its warm (and a sleeping pool's hot) start-up replaced by what this
    deployment's replicas measured.

    A new replica of a running deployment lands on a node that is up, with the weights on its
    disk after the first load: the warm tier. Each replica reports how long its engine took to
    load; the median of the running ones is the policy's warm start-up (kept between the hot
    and cold figures). `promote_s`: given for a model whose standbys sleep (the start-up model's
    promotion, capacity/perf/startup_measured.py); the hot tier is then the median of the wakes the
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


def observed_lengths(ctx: PolicyContext) -> LengthStats | None:
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


def with_observed_capacity(config: AutoscaleConfig, ctx: PolicyContext,
                           capacity: CapacityTable | None) -> AutoscaleConfig:
    """The config with `replica_capacity_rps` re-estimated by the capacity model for the request
    lengths the replicas report (capacity/perf/length_capacity.py). The configured figure, planned
    for another mix or typed, stands until enough requests have finished, when the model has no
    table for this deployment, or when it says no rate meets the SLO at these lengths."""
    lengths = observed_lengths(ctx) if capacity is not None else None
    if lengths is None or capacity is None:
        return config
    rps = capacity.rps_at(lengths.prompt_mean, lengths.output_mean)
    return dataclasses.replace(config, replica_capacity_rps=rps) if rps > 0 else config


def decide_from_context(ctx: PolicyContext, config: AutoscaleConfig, demand: IngressDemand | None = None,
                        capacity: CapacityTable | None = None,
                        warm_tier: WarmTierRecord | None = None,
                        slot_of: Mapping[str, int] | None = None,
                        promote_s: float | None = None,
                        saved: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """The whole translation, context in, Serve's answer out; no logging, no I/O.

    `warm_tier`: the warm-tier aggregator's last record (None: none runs, so no warm node is
    kept). `slot_of`: replica id -> planned slot, for a model that runs one deployment per slot
    (slot_autoscaling.py). Serve then stops the replicas in the slots at or above the new
    target (autoscale/slots.py), so the roles are assigned among the others and the leaving
    ones are out of rotation at once. `promote_s`: a sleeping pool's promotion
    (`with_measured_startup`). `saved`: the envelope the policy saved before, taken
    only when Serve hands over no state (a new controller: autoscale/memory/resume.py)."""
    config = with_observed_capacity(with_measured_startup(config, ctx, promote_s), ctx, capacity)
    prior_state = ctx.policy_state or {}
    prior = prior_state.get(POLICY_STATE_KEY)
    roles = RolesState.from_dict(prior_state.get(ROLES_KEY))
    running, order, snapshot = pool_view(ctx, roles, config.look_back_s, demand)
    state = PolicyState.from_dict(prior) if prior else \
        PolicyState(envelope=resumed_envelope(saved, snapshot.now, config))
    decision, state = decide(snapshot, config, state)
    gone = leaving(slot_of, serve_target(decision.target_active, decision.target_standby)) if slot_of else frozenset()
    assignment = roles_after(snapshot, [r for r in running if r not in gone], order, roles, decision.target_active)
    reason = decision.reason
    standby = dict(decision.target_standby)
    standby[Tier.WARM], why_not_warm = live_warm_target(
        standby.get(Tier.WARM, 0), ctx.deployment_name, warm_tier, snapshot.now, TTL_S)
    if why_not_warm:
        reason = f"{reason}; {why_not_warm}"
    record = decision_record(snapshot, config, decision, standby, assignment, demand, reason)
    # Serve keeps policy_state between calls and wants plain data: the record's JSON form.
    policy_state = {**prior_state, POLICY_STATE_KEY: state.to_dict(), **roles_and_record(assignment, record)}
    return record.serve_target, policy_state


def pool_view(ctx: PolicyContext, roles: RolesState, look_back_s: float,
              demand: IngressDemand | None) -> tuple[list[str], tuple[str, ...], Snapshot]:
    """A deployment's running replicas, their age order (roles.py) and the policy's snapshot of
    them, with the replicas `roles` left active serving."""
    running = [replica_key(r) for r in ctx.running_replicas]
    order = age_order(running, roles.order)
    return running, order, snapshot_from_context(ctx, look_back_s, current_active(order, roles.active), demand)


def roles_after(snapshot: Snapshot, running: Collection[str], order: tuple[str, ...], roles: RolesState,
                target_active: int) -> RoleAssignment:
    """Who serves after a decision for `target_active` actives among `running`. Surplus actives
    are demoted least-loaded first (roles.scale_down_victims, as the simulator drains them);
    which replica Serve then stops is Serve's choice (see roles.py)."""
    in_flight = {r.replica_id: r.waiting + r.running for r in snapshot.replicas}
    return assign_roles(running, order, roles.active, target_active, in_flight)


def decision_record(snapshot: Snapshot, config: AutoscaleConfig, decision: ScaleDecision, standby: Mapping[Tier, int],
                    assignment: RoleAssignment, demand: IngressDemand | None, reason: str) -> DecisionRecord:
    """What a deployment's decision publishes: `reason` with the role changes after it."""
    if assignment.describe():
        reason = f"{reason}; {assignment.describe()}"
    return DecisionRecord(
        at=snapshot.now,
        target_active=decision.target_active,
        target_standby=dict(standby),
        active_replicas=tuple(assignment.active),
        standby_replicas=tuple(assignment.standby),
        held_at_ingress=demand.held if demand else 0,
        refused_rps_at_ingress=demand.refused_rps if demand else 0.0,
        startup_s=dict(config.startup_s),
        burst_hold=decision.burst_hold,
        not_in_time=decision.not_in_time,
        prior_source=config.prior_source,
        prior_hold=prior_hold(config),
        reason=reason,
        serve_target=serve_target(decision.target_active, standby),
    )


def roles_and_record(assignment: RoleAssignment, record: DecisionRecord) -> dict[str, Any]:
    """A deployment's roles and decision as its Serve policy_state keeps them (plain data)."""
    return {ROLES_KEY: RolesState.of(assignment).to_dict(), DECISION_KEY: record.to_dict()}


def decision_in(policy_state: dict[str, Any] | None) -> DecisionRecord | None:
    """The decision record `decide_from_context` left in a policy_state, typed."""
    raw = (policy_state or {}).get(DECISION_KEY)
    return DecisionRecord.from_dict(raw, source="Serve policy_state") if raw else None


def _plan(decision: DecisionRecord) -> tuple:
    """What a decision changes in the cluster, and the replicas it withheld as not in time; a
    new plan is logged, a repeated one is not (a hold through a burst is logged once)."""
    return decision.target_active, dict(decision.target_standby), decision.active_replicas, decision.not_in_time


class HbmServeAutoscalingPolicy:
    """What `AutoscalingPolicy(policy_function=POLICY_PATH, policy_kwargs=...)` builds."""

    def __init__(self, capacity_by_length: dict[str, Any] | None = None, promote_s: float | None = None,
                 **config_fields: Any) -> None:
        self.config = AutoscaleConfig.from_dict(config_fields)
        self.capacity = CapacityTable.from_dict(capacity_by_length) if capacity_by_length else None
        self.promote_s = promote_s  # set for a model whose standbys sleep (with_measured_startup)
        self._log = logging.getLogger("ray.serve")
        self._decisions = DecisionLog()
        self._envelope_saved: dict[str, tuple[float, Any]] = {}  # deployment -> (when, what) last saved

    def __call__(self, ctx: PolicyContext) -> tuple[int, dict[str, Any]]:
        return self.step(ctx, ctx.deployment_name)

    def step(self, ctx: PolicyContext, deployment: str,
             slot_of: Mapping[str, int] | None = None) -> tuple[int, dict[str, Any]]:
        """Decide for `deployment`'s replicas in `ctx`, log a changed plan, publish the record
        under `deployment` (the model's engine deployment, also for a slotted model)."""
        app = ctx.app_name
        try:
            warm_tier = latest_warm_tier()
        except RecordError:  # another hbmserve version's aggregator: keep no warm pool, as with none
            warm_tier = None
        saved = None if (ctx.policy_state or {}).get(POLICY_STATE_KEY) else saved_envelope(app, deployment)
        target, policy_state = decide_from_context(ctx, self.config, ingress_demand(app, deployment),
                                                   self.capacity, warm_tier, slot_of, self.promote_s, saved)
        self._save_envelope(app, deployment, policy_state[POLICY_STATE_KEY].get("envelope"))
        decision = decision_in(policy_state)
        if publish_decision(self._decisions, app, deployment, decision, ctx.policy_state):
            self._log.info("hbmserve autoscale %s: serve replicas %d; %s", deployment, target,
                           decision.reason)
        return target, policy_state


    def _save_envelope(self, app: str | None, deployment: str, envelope: dict[str, Any] | None) -> None:
        """Keep the envelope in Ray's KV store when it changed, at most every ENVELOPE_SAVE_S."""
        last_at, last = self._envelope_saved.get(deployment, (float("-inf"), None))
        now = time.monotonic()
        if envelope is None or envelope == last or now - last_at < ENVELOPE_SAVE_S:
            return
        save_envelope(app, deployment, envelope)
        self._envelope_saved[deployment] = (now, envelope)


def publish_decision(log: DecisionLog, app: str | None, deployment: str, decision: DecisionRecord,
                     prior_state: dict[str, Any] | None) -> bool:
    """Publish `deployment`'s decision; True when it changed the plan of the decision left in
    `prior_state` (then it joins the history, and the policy logs it). The replicas follow
    `active_replicas` from this record: it is published every tick, so a restarted replica or
    controller converges without waiting for a change."""
    try:
        previous = decision_in(prior_state)
    except RecordError:  # left by another hbmserve version: only the log line depends on it
        previous = None
    changed = previous is None or _plan(previous) != _plan(decision)
    log.publish(app, deployment, decision, changed=changed)
    return changed
