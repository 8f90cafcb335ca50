"""Autoscaling a disaggregated model whose two pools both autoscale: two Serve deployments, one
decision (issue 23 req 5).

Such a model runs as `engine-<model>-prefill` and `engine-<model>-decode` (deployments/apps/model_app.py),
each a Serve deployment whose policy sees only its own replicas; the two-pool policy
(autoscale/pools/pools_policy.py `decide_pools`) needs both. So, as for a placed model's slots
(slot_autoscaling.py, which says why Serve's application-level policy is out of reach on Ray 2.60):

* The prefill pool's policy publishes what its context holds (records_store `publish_slot_stats`,
  under the prefill deployment's name, as its slot 0) and answers Serve with the prefill half of
  the last published decision (`latest_decision` for its deployment; before any, Serve's target).
* The decode pool's policy leads: it merges the prefill pool's fresh stats into a context
  (`model_context`), decides for both (`decide_pools_from_contexts`, pure), publishes one
  decision record per pool deployment, each leading with its own action and then the joint
  reason (so each pool's last-action gauge reads its own), where the front doors, the
  replicas' roles and `hbmserve status` read them, and answers Serve with the decode half. Both
  pools' hysteresis and roles live in its policy_state.

The prefill pool acts on the leader's previous tick (Serve's control loop runs every 0.1 s), and
until the prefill pool's policy has reported once the leader holds both counts. The pools keep
no standbys (pools_policy.py), so a replica is active unless surplus.

What the replicas report becomes the two-pool snapshot. The prompt backlog: the prefill replicas'
waiting requests times the mean prompt they finished (`observed_lengths`), or the configured
`prompt_mean_tokens` until MIN_LENGTH_SAMPLES requests have; the prompt-token rate: the prefill
pool's arrivals times the same mean. The TTFT samples are the prefill replicas' own (arrival
there to the prompt's first token), the closest the replicas come to the client's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from hbmserve.autoscale.pools.pools_policy import PoolsConfig, PoolsSnapshot, PoolsState, decide_pools
from hbmserve.autoscale.roles import RolesState
from hbmserve.core.disagg_spec import Role
from hbmserve.core.records import DecisionRecord, IngressDemand
from hbmserve.core.serve_context import PolicyContext
from hbmserve.deployments.control.autoscaling import (ROLES_KEY, decision_record, observed_lengths, pool_view,
                                                      publish_decision, roles_after, roles_and_record,
                                                      with_measured_startup)
from hbmserve.deployments.control.slot_autoscaling import model_context, stats_of
from hbmserve.deployments.wire.records_store import (DecisionLog, ingress_demand, latest_decision,
                                                     publish_slot_stats, slot_stats)

POOLS_POLICY_PATH = "hbmserve.deployments.control.pool_autoscaling:PoolsAutoscalingPolicy"
POOLS_STATE_KEY = "hbmserve_pools"


@dataclass(frozen=True)
class PoolsOutcome:
    prefill: DecisionRecord
    decode: DecisionRecord
    reason: str  # the joint one, in both records after each pool's own action
    policy_state: dict[str, Any]  # the leader's: the pools' state, and per pool its roles and record


def prompt_mean(ctx: PolicyContext, configured: float) -> float:
    """Mean prompt tokens the prefill replicas in `ctx` finished; `configured` below the samples
    `observed_lengths` wants."""
    lengths = observed_lengths(ctx)
    return configured if lengths is None else lengths.prompt_mean


def decide_pools_from_contexts(prefill: PolicyContext, decode: PolicyContext, config: PoolsConfig,
                               prompt_mean_tokens: float, prefill_demand: IngressDemand | None = None,
                               decode_demand: IngressDemand | None = None) -> PoolsOutcome:
    """Both pools' contexts in, both decision records out; no logging, no I/O. `decode` is the
    leader's own context: its policy_state carries the pools' state between calls. Each pool's
    config takes the start-up its replicas measured (`with_measured_startup`)."""
    prior = dict(decode.policy_state or {})
    pools = {Role.PREFILL: (prefill, prefill_demand, with_measured_startup(config.prefill, prefill)),
             Role.DECODE: (decode, decode_demand, with_measured_startup(config.decode, decode))}
    views = {}
    for role, (ctx, demand, cfg) in pools.items():
        roles = RolesState.from_dict((prior.get(role.value) or {}).get(ROLES_KEY))
        views[role] = (roles, *pool_view(ctx, roles, cfg.look_back_s, demand))
    pre, dec = views[Role.PREFILL][3], views[Role.DECODE][3]
    mean = prompt_mean(prefill, prompt_mean_tokens)
    snapshot = PoolsSnapshot(pre, dec, prompt_backlog_tokens=round(sum(r.waiting for r in pre.replicas) * mean),
                             prompt_tokens_rps=pre.arrival_rate_rps * mean)
    config = replace(config, prefill=pools[Role.PREFILL][2], decode=pools[Role.DECODE][2])
    decision, state = decide_pools(snapshot, config, PoolsState.from_dict(prior.get(POOLS_STATE_KEY)))
    policy_state: dict[str, Any] = {**prior, POOLS_STATE_KEY: state.to_dict()}
    records = {}
    for role, scale in ((Role.PREFILL, decision.prefill), (Role.DECODE, decision.decode)):
        roles, running, order, snap = views[role]
        _, demand, cfg = pools[role]
        assignment = roles_after(snap, running, order, roles, scale.target_active)
        records[role] = decision_record(snap, cfg, scale, scale.target_standby, assignment, demand, scale.reason)
        policy_state[role.value] = roles_and_record(assignment, records[role])
    return PoolsOutcome(records[Role.PREFILL], records[Role.DECODE], decision.reason, policy_state)


class PoolsAutoscalingPolicy:
    """What Serve builds for each pool deployment of a disaggregated model whose pools both
    autoscale. `pools` (a PoolsConfig's `to_dict`) and `prompt_mean_tokens` are given to the
    decode pool's policy only, which leads; the prefill pool's reports and follows."""

    def __init__(self, prefill_deployment: str, look_back_s: float, pools: dict[str, Any] | None = None,
                 prompt_mean_tokens: float | None = None) -> None:
        self.prefill_deployment, self.look_back_s = prefill_deployment, look_back_s
        self.config = PoolsConfig.from_dict(pools) if pools is not None else None
        if self.config is not None and not (prompt_mean_tokens or 0) > 0:
            raise ValueError(f"prompt_mean_tokens must be > 0 for the leading pool, got {prompt_mean_tokens}")
        self.prompt_mean_tokens = prompt_mean_tokens
        self._log = logging.getLogger("ray.serve")
        self._decisions = DecisionLog()

    def __call__(self, ctx: PolicyContext) -> tuple[int, dict[str, Any]]:
        app = ctx.app_name
        if self.config is None:
            publish_slot_stats(app, self.prefill_deployment, stats_of(ctx, 0, self.look_back_s))
            decision = latest_decision(app, self.prefill_deployment)
            return (ctx.target_num_replicas if decision is None else decision.serve_target), {}
        now = ctx.current_time if ctx.current_time is not None else time.time()
        reports = slot_stats(app, self.prefill_deployment, now)
        if not reports:  # the prefill pool's policy has not reported yet
            return ctx.target_num_replicas, dict(ctx.policy_state or {})
        prefill, _ = model_context(reports, now, {}, app, self.prefill_deployment)
        outcome = decide_pools_from_contexts(prefill, ctx, self.config, self.prompt_mean_tokens,
                                             ingress_demand(app, self.prefill_deployment),
                                             ingress_demand(app, ctx.deployment_name))
        prior = ctx.policy_state or {}
        changed = [publish_decision(self._decisions, app, deployment, record, prior.get(role.value))
                   for role, deployment, record in ((Role.PREFILL, self.prefill_deployment, outcome.prefill),
                                                    (Role.DECODE, ctx.deployment_name, outcome.decode))]
        if any(changed):
            self._log.info("hbmserve autoscale %s, %s: serve replicas %d, %d; %s", self.prefill_deployment,
                           ctx.deployment_name, outcome.prefill.serve_target, outcome.decode.serve_target,
                           outcome.reason)
        return outcome.decode.serve_target, outcome.policy_state
