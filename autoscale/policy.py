"""hbmserve's scaling policy: scale on the symptom, start early enough, keep the right pool warm.

    decide(snapshot, config, state) -> (ScaleDecision, PolicyState)

Pure: no I/O, no wall clock (time is `snapshot.now`). The live adapter
(deployments/control/autoscaling.py) and the simulator (capacity/sim/cluster_sim.py) call this same function.

`decide` runs named stages (stages.py), each a pure function of frozen values:

    read_signals      snapshot -> Signals: load, rate trend, p95 TTFT/TPOT, blind/echo muting,
                      the burst envelope (envelope.py)
    needs_of          Signals -> Needs: replicas the rate, queue, TTFT, TPOT, ingress, the burst
                      envelope ask for
    wish              Needs -> Wish: up-need, down-need, slack, symptom or forecast
    apply_hysteresis  Wish + PolicyState -> Outcome: delays, cool-down, stabilisation floor,
                      max_replicas cap; writes PolicyState
    pool_for          standbys per tier (warm_pool.size_pool)
    hold_pool         the pool's own hysteresis (warm_pool.hold_tier); writes PolicyState
    explain           the reason string

then the drivers apply roles: which replicas serve (roles.py: assign_roles live,
scale_down_victims in both drivers).

How a decision is made, each term in the reason string:

* Rate need. The arrival rate is smoothed, fast and slow; their gap gives its trend
  (signals.RateTrend). n replicas are enough when the rate expected by the time the next
  replica could be ready fits in them at `target_utilization`. "The next replica" comes from
  the fastest tier with capacity: hot standbys first (promotion, seconds), then warm nodes
  (weights on NVMe), then cold; its start-up time is the forecast horizon. A rising trend
  therefore orders replicas early, and more so when only slow tiers are left.
* Queue need. Waiting requests per active replica above `target_queue_per_replica` ask for
  enough extra replicas to absorb the excess (signals.queue_need): what is left when help
  could arrive must drain within max(TTFT target, that help's start-up), at most
  `backlog_drain_s`.
* TTFT need. p95 TTFT above target asks for active·p95/target replicas (at most
  `max_latency_growth`× per step). TTFT samples describe the past, so after a scale-up the signal
  is ignored until the new replicas can have served a full look-back window.
* TPOT need (only with `tpot_p95_target_s`). A p95 time per output token over target with no
  queue means the active replicas run batches too large: every running sequence waits for the
  whole batch's step. Model: a decode step's time grows about linearly with the batch, and the
  router spreads the running sequences evenly, so TPOT ∝ running/active and
  active·p95/target replicas bring it to target (at most `max_latency_growth`× per step). The
  fixed part of a step (weights read once per step) does not shrink with the batch, so this
  under-asks when p95 is far over target; the next step after the blind window corrects it.
  Same blind window as TTFT after a scale-up, and the same rule for the queue's echo. When the
  target is at or below `tpot_floor_s` (one sequence decoding alone already takes that long with
  these engine settings) no replica count reaches it, and the TPOT need is 0: chasing it would
  only run the fleet to max_replicas.
* Burst envelope (envelope.py; off with burst_memory_s 0). How far the rate climbed within
  each cold-start-long bucket of the last burst_memory_s, and the replicas whose saved misses
  (slo_miss_usd each) outweigh their idle cost (hot_idle_usd_per_hour) were such a rise to start
  from the lowest rate now. A replica let go in a lull comes back a cold start later, after the
  next burst of a bursty service has come and gone: so the envelope is the least a scale-down
  keeps, and a forecast-only need on the way up (it orders ahead of the next burst).
* Up: target = max(needs) once the wish has lasted `upscale_delay_s` when a symptom (queue,
  TTFT, TPOT, ingress backlog) asks for it, or `rate_upscale_delay_s` when only the rate forecast
  does: a rate averaged over a window wanders for about that window under a constant load,
  and a forecast is not yet a miss. Requests held at the ingress with no active replica
  scale from zero at once.
* Down: only when every symptom shows slack (no ingress backlog, queue, p95 TTFT and p95 TPOT
  well under target, KV not full) and the rate fits in fewer replicas at the lower
  `downscale_utilization`, never below the burst envelope; the gap between the two utilisations is the dead band that stops
  flapping under a constant noisy load. The wish must persist for `downscale_delay_s` (or
  `scale_to_zero_delay_s` to reach 0), and no scale-down comes within `downscale_cooldown_s`
  of a scale-up, nor before the replicas that scale-up ordered serve: a start, once ordered,
  is not cancelled (a cancelled start bills a replica for nothing and is churn, issue 14).
  The highest need seen while waiting is the one applied (a stabilisation window, as in
  Kubernetes' HPA; the persistence timers are SkyPilot-style hysteresis kept as data in
  PolicyState).
* Pool: standbys per tier from the cost model in warm_pool.py. The executor refills the pool
  toward these targets in the background after promotions consume it. A standby bills from its
  order, so the counts have hysteresis both ways (stages.hold_pool): a bigger pool is ordered
  once wished for `rate_upscale_delay_s` (a forecast, like a forecast-only scale-up), a smaller
  one applied once wished for `downscale_delay_s` (like a scale-down); a change that orders and
  cancels nothing (a demotion into the pool, standbys promoted out of it) applies at once.
  Without it the sizing, which follows every wobble of the rate's spread, ordered standbys and
  cancelled them seconds later (issue 14).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from hbmserve.autoscale.envelope import BurstEnvelope
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.signals import RateTrend
from hbmserve.autoscale.stages import (apply_hysteresis, explain, hold_pool, needs_of,
                                      plan_promotions, pool_for, rate_need, read_signals,
                                      tier_sequence, wish)
from hbmserve.autoscale.warm_pool import PoolHold
from hbmserve.core.scaling import ScaleDecision, Snapshot, Tier

# AutoscaleConfig lives with its builder (config.py); plan_promotions, rate_need and
# tier_sequence with the stages that use them; they are part of this module's face for the
# executor and the tests.
__all__ = ["AutoscaleConfig", "PolicyState", "decide", "plan_promotions", "rate_need",
           "tier_sequence"]


@dataclass(frozen=True)
class PolicyState:
    target_active: int | None = None  # last decision; None before the first one
    trend: RateTrend | None = None
    up_since: float | None = None  # when the current wish to scale up began
    down_since: float | None = None
    down_floor: int = 0  # highest need seen since down_since
    last_scale_up_at: float | None = None
    starts_ready_at: float | None = None  # when the replicas the last scale-up ordered serve
    last_scale_down_at: float | None = None
    latency_blind_until: float | None = None  # TTFT and TPOT samples predate the last scale-up
    queue_over_at: float | None = None  # last time the queue was over target (TTFT/TPOT echo)
    pool_hot: PoolHold | None = None  # standbys held per tier, after the pool's hysteresis
    pool_warm: PoolHold | None = None
    envelope: BurstEnvelope | None = None  # the burst envelope learned so far (envelope.py)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, for Ray Serve's policy_state dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PolicyState:
        values = {k: v for k, v in values.items() if k in {f.name for f in fields(cls)}}
        trend = values.get("trend")
        if isinstance(trend, dict):
            values["trend"] = RateTrend(**trend)
        if isinstance(values.get("envelope"), dict):
            values["envelope"] = BurstEnvelope.from_dict(values["envelope"])
        for tier in ("pool_hot", "pool_warm"):
            if isinstance(values.get(tier), dict):
                values[tier] = PoolHold(**values[tier])
        return cls(**values)


def decide(snapshot: Snapshot, config: AutoscaleConfig,
           state: PolicyState) -> tuple[ScaleDecision, PolicyState]:
    signals = read_signals(snapshot, config, state)
    needs = needs_of(signals, config)
    outcome = apply_hysteresis(wish(needs, signals, config), signals, state, config)
    pool, state = hold_pool(pool_for(signals, config, outcome.target, needs.known), signals, outcome.state,
                            config, outcome.target)
    decision = ScaleDecision(
        target_active=outcome.target,
        target_standby={Tier.HOT: pool.hot, Tier.WARM: pool.warm, Tier.COLD: 0},
        reason=explain(outcome, signals, needs, pool, config),
        burst_hold=needs.burst.replicas if needs.burst is not None else 0,
        not_in_time=outcome.not_in_time,
    )
    return decision, state
