"""hbmserve's scaling policy: scale on the symptom, start early enough, keep the right pool warm.

    decide(snapshot, config, state) -> (ScaleDecision, PolicyState)

Pure: no I/O, no wall clock (time is `snapshot.now`). The live adapter
(control/autoscaling.py) and the simulator (sim/cluster_sim.py) call this same function.

`decide` runs named stages (stages.py), each a pure function of frozen values:

    read_signals      snapshot -> Signals: load, rate trend, p95 TTFT/TPOT, blind/echo muting
    needs_of          Signals -> Needs: replicas the rate, queue, TTFT, TPOT, ingress ask for
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
* Up: target = max(needs) once the wish has lasted `upscale_delay_s` when a symptom (queue,
  TTFT, TPOT, ingress backlog) asks for it, or `rate_upscale_delay_s` when only the rate forecast
  does: a rate averaged over a window wanders for about that window under a constant load,
  and a forecast is not yet a miss. Requests held at the ingress with no active replica
  scale from zero at once.
* Down: only when every symptom shows slack (no ingress backlog, queue, p95 TTFT and p95 TPOT
  well under target, KV not full) and the rate fits in fewer replicas at the lower
  `downscale_utilization`; the gap between the two utilisations is the dead band that stops
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

from hbmserve.autoscale.signals import RateTrend
from hbmserve.autoscale.stages import (apply_hysteresis, explain, hold_pool, needs_of,
                                      plan_promotions, pool_for, rate_need, read_signals,
                                      tier_sequence, wish)
from hbmserve.autoscale.warm_pool import PoolHold
from hbmserve.core.scaling import ScaleDecision, Snapshot, Tier

# plan_promotions, rate_need and tier_sequence live with the stages that use them; they are
# part of this module's face for the executor and the tests.
__all__ = ["AutoscaleConfig", "PolicyState", "decide", "plan_promotions", "rate_need",
           "tier_sequence"]


@dataclass(frozen=True)
class AutoscaleConfig:
    ttft_p95_target_s: float = 2.0
    target_queue_per_replica: float = 4.0
    min_replicas: int = 1
    max_replicas: int = 16
    # Requests/s one replica sustains within the SLO: measured (capacity perf model or bench).
    replica_capacity_rps: float = 1.0
    target_utilization: float = 0.8  # scale up past this share of capacity
    downscale_utilization: float = 0.7  # scale down only if the rest would run below this
    # Measured start-up per tier (defaults: the 70B-on-H100 reference cluster).
    startup_hot_s: float = 5.0
    startup_warm_s: float = 45.0
    startup_cold_s: float = 180.0
    hot_standby_min: int = 0
    hot_standby_max: int = 2
    warm_pool_min: int = 0
    warm_pool_max: int = 4
    # Pool economics (warm_pool.py). Defaults are assumptions to override per cluster: a
    # TP=4 replica idles at ~4 GPUs' price; a warm node's GPUs are lent to preemptible work.
    hot_idle_usd_per_hour: float = 10.0
    warm_idle_usd_per_hour: float = 2.5
    slo_miss_usd: float = 0.01
    upscale_delay_s: float = 5.0  # for symptom-driven scale-up
    rate_upscale_delay_s: float = 30.0  # for forecast-only scale-up
    downscale_delay_s: float = 60.0  # tuned: ops/bench/autoscale_eval.py
    scale_to_zero_delay_s: float | None = None  # None: downscale_delay_s
    downscale_cooldown_s: float = 60.0  # no scale-down this soon after a scale-up
    # Window the driver uses for ttft_samples_s and arrival_rate_rps.
    look_back_s: float = 30.0
    # A queue left when new replicas could arrive must be gone at most this much later
    # (signals.queue_need; sooner when help is fast, see decide). 180 s: one reference cold
    # start; 120 s made a sharp step order replicas to drain, faster than one more cold start,
    # a backlog whose requests had already missed their TTFT (issue 14: up to 6% of the
    # GPU-hours on the sharp-burst trace, no attainment).
    backlog_drain_s: float = 180.0
    rate_smoothing_s: float = 5.0  # fast average of the rate
    trend_window_s: float = 120.0  # slow average; the trend is their gap (signals.RateTrend)
    rate_variance_window_s: float = 600.0
    trend_z: float = 1.0  # trust only the slope beyond this many of its own std devs
    slope_noise_window_s: float = 300.0  # memory of how much the slope estimate wanders
    # p95 TPOT target (s), from the SLO; None: TPOT is no signal.
    tpot_p95_target_s: float | None = None
    # The lowest TPOT a replica reaches with these engine settings (one sequence decoding alone;
    # the capacity model's figure, passed in by the config builder). A target at or below it is
    # a miss replicas cannot fix, so the TPOT signal then asks for none. None: unknown.
    tpot_floor_s: float | None = None
    min_latency_samples: int = 5  # fewer TTFT (or TPOT) samples than this are no signal
    max_latency_growth: float = 2.0  # most a TTFT or TPOT need multiplies the actives per step
    # A fraction of the TTFT target, not of the idle TTFT: long prompts alone can take half of it.
    ttft_down_fraction: float = 0.8
    queue_down_fraction: float = 0.25
    kv_usage_down_max: float = 0.8
    tpot_down_fraction: float = 0.8

    def __post_init__(self) -> None:
        problems = []
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            problems.append(
                f"min_replicas ({self.min_replicas}) must be in [0, max_replicas "
                f"({self.max_replicas})] and max_replicas >= 1"
            )
        if not 0 < self.downscale_utilization < self.target_utilization <= 1:
            problems.append(
                "need 0 < downscale_utilization < target_utilization <= 1, got "
                f"{self.downscale_utilization} and {self.target_utilization}"
            )
        if self.trend_window_s <= self.rate_smoothing_s:
            problems.append("trend_window_s must be > rate_smoothing_s")
        if not 0 <= self.startup_hot_s <= self.startup_warm_s <= self.startup_cold_s:
            problems.append("need 0 <= startup_hot_s <= startup_warm_s <= startup_cold_s")
        if self.hot_standby_min > self.hot_standby_max or self.warm_pool_min > self.warm_pool_max:
            problems.append("standby bounds: min must be <= max (hot_standby_*, warm_pool_*)")
        if self.tpot_p95_target_s is not None and not self.tpot_p95_target_s > 0:
            problems.append(f"tpot_p95_target_s must be > 0 or None, got {self.tpot_p95_target_s}")
        for name in ("ttft_p95_target_s", "target_queue_per_replica", "replica_capacity_rps",
                     "look_back_s", "rate_smoothing_s", "rate_variance_window_s",
                     "slope_noise_window_s", "backlog_drain_s"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0")
        for name in ("upscale_delay_s", "rate_upscale_delay_s", "downscale_delay_s",
                     "downscale_cooldown_s", "hot_standby_min", "warm_pool_min", "slo_miss_usd",
                     "hot_idle_usd_per_hour", "warm_idle_usd_per_hour"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def startup_s(self) -> dict[Tier, float]:
        return {Tier.HOT: self.startup_hot_s, Tier.WARM: self.startup_warm_s,
                Tier.COLD: self.startup_cold_s}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> AutoscaleConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown autoscale config field(s): {', '.join(unknown)}")
        return cls(**values)


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

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, for Ray Serve's policy_state dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PolicyState:
        values = {k: v for k, v in values.items() if k in {f.name for f in fields(cls)}}
        trend = values.get("trend")
        if isinstance(trend, dict):
            values["trend"] = RateTrend(**trend)
        for tier in ("pool_hot", "pool_warm"):
            if isinstance(values.get(tier), dict):
                values[tier] = PoolHold(**values[tier])
        return cls(**values)


def decide(snapshot: Snapshot, config: AutoscaleConfig,
           state: PolicyState) -> tuple[ScaleDecision, PolicyState]:
    signals = read_signals(snapshot, config, state)
    needs = needs_of(signals, config)
    outcome = apply_hysteresis(wish(needs, signals, config), signals, state, config)
    pool, state = hold_pool(pool_for(signals, config, outcome.target), signals, outcome.state,
                            config, outcome.target)
    decision = ScaleDecision(
        target_active=outcome.target,
        target_standby={Tier.HOT: pool.hot, Tier.WARM: pool.warm, Tier.COLD: 0},
        reason=explain(outcome, signals, needs, pool, config),
    )
    return decision, state
