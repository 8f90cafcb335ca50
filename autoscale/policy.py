"""hbmserve's scaling policy: scale on the symptom, start early enough, keep the right pool warm.

    decide(snapshot, config, state) -> (ScaleDecision, PolicyState)

Pure: no I/O, no wall clock (time is `snapshot.now`). The live adapter (serve_adapter.py) and
the simulator call this same function.

How a decision is made, each term in the reason string:

* Rate need. The arrival rate is smoothed, fast and slow; their gap gives its trend
  (signals.RateTrend). n replicas are enough when the rate expected by the time the next
  replica could be ready fits in them at `target_utilization`. "The next replica" comes from the fastest tier with capacity: hot
  standbys first (promotion, seconds), then warm nodes (weights on NVMe), then cold; its
  start-up time is the forecast horizon. A rising trend therefore orders replicas early, and
  more so when only slow tiers are left.
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
  Same blind window as TTFT after a scale-up, and the same rule for the queue's echo.
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
  of a scale-up. The highest need seen while waiting is the one applied (a stabilisation
  window, as in Kubernetes' HPA; the persistence timers are SkyPilot-style hysteresis kept
  as data in PolicyState).
* Pool: standbys per tier from the cost model in warm_pool.py. The executor refills the pool
  toward these targets in the background after promotions consume it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Callable

from hbmserve.autoscale.signals import (Load, RateTrend, latency_need, load_of, p95, queue_need,
                                       update_trend)
from hbmserve.core.scaling import ReplicaState, ScaleDecision, Snapshot, Tier
from hbmserve.autoscale.warm_pool import PoolEconomics, PoolSizing, size_pool


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
    # (signals.queue_need; sooner when help is fast, see decide).
    backlog_drain_s: float = 120.0
    rate_smoothing_s: float = 5.0  # fast average of the rate
    trend_window_s: float = 120.0  # slow average; the trend is their gap (signals.RateTrend)
    rate_variance_window_s: float = 600.0
    trend_z: float = 1.0  # trust only the slope beyond this many of its own std devs
    slope_noise_window_s: float = 300.0  # memory of how much the slope estimate wanders
    # p95 TPOT target (s), from the SLO; None: TPOT is no signal.
    tpot_p95_target_s: float | None = None
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
    last_scale_down_at: float | None = None
    latency_blind_until: float | None = None  # TTFT and TPOT samples predate the last scale-up
    queue_over_at: float | None = None  # last time the queue was over target (TTFT/TPOT echo)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, for Ray Serve's policy_state dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PolicyState:
        values = {k: v for k, v in values.items() if k in {f.name for f in fields(cls)}}
        trend = values.get("trend")
        if isinstance(trend, dict):
            values["trend"] = RateTrend(**trend)
        return cls(**values)


def tier_sequence(standby: int, warm_ready: int) -> Callable[[int], Tier]:
    """Tier the i-th new replica (1-based) comes from: the fastest one with capacity."""

    def tier_for(i: int) -> Tier:
        if i <= standby:
            return Tier.HOT
        if i <= standby + warm_ready:
            return Tier.WARM
        return Tier.COLD

    return tier_for


def plan_promotions(snapshot: Snapshot, target_active: int) -> dict[Tier, int]:
    """Where the replicas that `target_active` adds come from: hot standbys, then warm
    nodes, then cold. Empty when nothing is to be added. The executor follows this."""
    have = snapshot.count(ReplicaState.ACTIVE) + snapshot.count(ReplicaState.STARTING)
    tier_for = tier_sequence(snapshot.count(ReplicaState.STANDBY), snapshot.warm_ready)
    plan: dict[Tier, int] = {}
    for i in range(1, target_active - have + 1):
        tier = tier_for(i)
        plan[tier] = plan.get(tier, 0) + 1
    return plan


def rate_need(trend: RateTrend, current: int, replica_rps: float, tier_for: Callable[[int], Tier],
              startup_s: dict[Tier, float], max_replicas: int) -> int:
    """Fewest replicas n that carry the rate expected when the n-th could be ready.

    For n <= current the horizon is the time to get one back if n proves too few."""
    for n in range(0, max_replicas + 1):
        horizon = startup_s[tier_for(max(1, n - current))]
        if trend.projected(horizon) <= n * replica_rps:
            return n
    return max_replicas


def _describe(load: Load, trend: RateTrend, needs: dict[str, int], p: float | None,
              n_ttft: int, config: AutoscaleConfig, blind: bool, p_tpot: float | None,
              n_tpot: int) -> str:
    ignored = " (ignored: new replicas not yet reflected)" if blind else ""
    ttft = "no p95 TTFT" if p is None else (
        f"p95 TTFT {p:.2f}s/{config.ttft_p95_target_s:.2f}s from {n_ttft} samples{ignored}")
    if config.tpot_p95_target_s is None:
        tpot = "TPOT not a signal"
    elif p_tpot is None:
        tpot = "no p95 TPOT"
    else:
        tpot = (f"p95 TPOT {1000 * p_tpot:.0f}ms/{1000 * config.tpot_p95_target_s:.0f}ms from "
                f"{n_tpot} samples{ignored}")
    return (
        f"rate {trend.level:.2f} rps ±{trend.sigma:.2f}, trend {trend.slope:+.4f}/s "
        f"(trusted {trend.trusted_slope:+.4f}/s) "
        f"(need {needs['rate']} at {config.replica_capacity_rps * config.target_utilization:.2f}"
        f" rps/replica); queue {load.queue_per_active:.1f}/replica vs "
        f"{config.target_queue_per_replica:g} (need {needs['queue']}); {ttft} "
        f"(need {needs['ttft']}); {tpot} (need {needs['tpot']}); kv {load.mean_kv_usage:.2f}; "
        f"active {load.active} starting {load.starting} standby {load.standby} "
        f"pending {load.pending}"
    )


def decide(snapshot: Snapshot, config: AutoscaleConfig,
           state: PolicyState) -> tuple[ScaleDecision, PolicyState]:
    now = snapshot.now
    load = load_of(snapshot)
    trend = update_trend(state.trend, now, snapshot.arrival_rate_rps,
                         fast_tau_s=config.rate_smoothing_s, slow_tau_s=config.trend_window_s,
                         variance_tau_s=config.rate_variance_window_s,
                         slope_tau_s=config.slope_noise_window_s, z=config.trend_z)
    current = state.target_active if state.target_active is not None else (
        load.active + load.starting)
    floor = max(config.min_replicas, 1 if load.pending > 0 else 0)
    startup = config.startup_s
    tier_for = tier_sequence(load.standby, snapshot.warm_ready)
    capacity = config.replica_capacity_rps
    idle = load.in_flight == 0 and snapshot.arrival_rate_rps <= 0.0

    blind = state.latency_blind_until is not None and now < state.latency_blind_until
    # A latency over target while requests queue past the target is the queue's wait showing up
    # late; queue_need already sizes that backlog (with what drains before help arrives), and
    # scaling on its echo as well ordered 2x the fleet after every burst had passed.
    # The samples cover look_back_s, so the echo outlasts the queue by that long.
    queued_over = load.waiting + load.pending > config.target_queue_per_replica * load.active
    queue_over_at = now if queued_over else state.queue_over_at
    echo = queue_over_at is not None and now - queue_over_at < config.look_back_s
    muted = blind or echo
    tpot_target = config.tpot_p95_target_s
    p = p95(snapshot.ttft_samples_s) if len(snapshot.ttft_samples_s) >= config.min_latency_samples \
        else None
    p_tpot = p95(snapshot.tpot_samples_s) if (
        tpot_target is not None and len(snapshot.tpot_samples_s) >= config.min_latency_samples) \
        else None
    n_ttft = latency_need(p, config.ttft_p95_target_s, load.active, config.max_latency_growth, muted)
    n_tpot = latency_need(p_tpot, tpot_target, load.active, config.max_latency_growth, muted)
    # A backlog left when help arrives must be gone within one more start-up of that help: fast
    # help (a hot standby) is no excuse for a slow drain, and a queued request waits for the
    # whole drain, so never longer than backlog_drain_s nor asked faster than the TTFT target.
    drain_s = min(config.backlog_drain_s, max(config.ttft_p95_target_s, startup[tier_for(1)]))
    needs = {
        "rate": 0 if idle else rate_need(trend, current, capacity * config.target_utilization,
                                         tier_for, startup, config.max_replicas),
        "queue": queue_need(load, config.target_queue_per_replica,
                            arrival_rps=snapshot.arrival_rate_rps, replica_rps=capacity,
                            horizon_s=startup[tier_for(1)], drain_s=drain_s),
        "ttft": n_ttft,
        "tpot": n_tpot,
        "ingress": 1 if load.pending > 0 else 0,
    }
    # Below the floor (min_replicas, or one replica for requests held at the ingress) is an
    # up-wish acted on at once.
    up_need = min(max(*needs.values(), floor), config.max_replicas)
    symptom_up = max(needs["queue"], needs["ttft"], needs["tpot"], needs["ingress"]) > current
    down_need = 0 if idle else max(1, rate_need(
        trend, current, capacity * config.downscale_utilization, tier_for, startup,
        config.max_replicas))
    slack = (
        load.pending == 0
        and load.queue_per_active <= config.target_queue_per_replica * config.queue_down_fraction
        and (p is None or p <= config.ttft_p95_target_s * config.ttft_down_fraction)
        and (p_tpot is None or tpot_target is None
             or p_tpot <= tpot_target * config.tpot_down_fraction)
        and load.mean_kv_usage <= config.kv_usage_down_max
    )
    signals = _describe(load, trend, needs, p, len(snapshot.ttft_samples_s), config, blind,
                        p_tpot, len(snapshot.tpot_samples_s))

    def pool_for(active: int) -> PoolSizing:
        return size_pool(
            target_active=active, trend=trend,
            replica_rps=capacity * config.target_utilization, replica_max_rps=capacity,
            startup_s=startup,
            economics=PoolEconomics(config.hot_idle_usd_per_hour,
                                    config.warm_idle_usd_per_hour, config.slo_miss_usd),
            hot_bounds=(config.hot_standby_min, config.hot_standby_max),
            warm_bounds=(config.warm_pool_min, config.warm_pool_max),
            max_replicas=config.max_replicas,
        )

    target = current
    pool_at: int | None = None  # active count the pool is sized for, when not `target`
    if current > config.max_replicas:
        target = config.max_replicas
        action = f"down {current}→{target} (max_replicas)"
        new = PolicyState(queue_over_at=queue_over_at, target_active=target, trend=trend,
                          last_scale_up_at=state.last_scale_up_at, last_scale_down_at=now,
                          latency_blind_until=state.latency_blind_until)
    elif up_need > current:
        since = state.up_since if state.up_since is not None else now
        urgent = current < floor
        delay = config.upscale_delay_s if symptom_up else config.rate_upscale_delay_s
        if urgent or now - since >= delay:
            target = up_need
            plan = plan_promotions(snapshot, target)
            slowest = max((startup[t] for t in plan), default=0.0)
            tiers = ", ".join(f"{n} {t.value}" for t, n in plan.items()) or "already starting"
            why = ""
            if urgent:
                why = (" from zero: requests held at the ingress" if current == 0 and load.pending
                       else f" to min_replicas {config.min_replicas}")
            action = f"up {current}→{target} ({tiers}){why}"
            new = PolicyState(queue_over_at=queue_over_at, target_active=target, trend=trend,
                              last_scale_up_at=now,
                              last_scale_down_at=state.last_scale_down_at,
                              latency_blind_until=now + slowest + config.look_back_s)
        else:
            action = (f"hold {current}, up to {up_need} pending "
                      f"({now - since:.1f}/{delay:g}s)")
            new = PolicyState(queue_over_at=queue_over_at, target_active=current, trend=trend,
                              up_since=since,
                              last_scale_up_at=state.last_scale_up_at,
                              last_scale_down_at=state.last_scale_down_at,
                              latency_blind_until=state.latency_blind_until)
    elif slack and max(down_need, floor) < current:
        wish = max(down_need, floor)
        since = state.down_since if state.down_since is not None else now
        down_floor = max(state.down_floor, wish) if state.down_since is not None else wish
        delay = config.downscale_delay_s
        if down_floor == 0 and config.scale_to_zero_delay_s is not None:
            delay = config.scale_to_zero_delay_s
        cooled = (state.last_scale_up_at is None
                  or now - state.last_scale_up_at >= config.downscale_cooldown_s)
        # A hot standby is rebuilt from scratch (a cold start's worth of preparation), while
        # an active replica about to go is already the faster thing: keep as many as the pool
        # still lacks until it is ready, so a step coming back in that gap finds them.
        missing = max(0, pool_for(down_floor).hot - load.standby)
        keep = min(current, down_floor + missing)
        if now - since >= delay and cooled and keep < current:
            target = keep
            pool_at = down_floor
            waiting = f", {keep - down_floor} kept until the pool is ready" if keep > down_floor \
                else ""
            action = f"down {current}→{target} (slack for {now - since:.0f}s{waiting})"
            new = PolicyState(queue_over_at=queue_over_at, target_active=target, trend=trend,
                              last_scale_up_at=state.last_scale_up_at, last_scale_down_at=now,
                              latency_blind_until=state.latency_blind_until,
                              down_since=since if keep > down_floor else None,
                              down_floor=down_floor if keep > down_floor else 0)
        else:
            if now - since >= delay and cooled:
                pool_at = down_floor
                wait = f"{missing} hot standby(s) not ready"
            else:
                wait = "cool-down after scale-up" if now - since >= delay else \
                    f"{now - since:.0f}/{delay:g}s"
            action = f"hold {current}, down to {down_floor} pending ({wait})"
            new = PolicyState(queue_over_at=queue_over_at, target_active=current, trend=trend,
                              down_since=since,
                              down_floor=down_floor, last_scale_up_at=state.last_scale_up_at,
                              last_scale_down_at=state.last_scale_down_at,
                              latency_blind_until=state.latency_blind_until)
    else:
        why = "at max_replicas" if up_need > current else (
            "symptoms not slack" if not slack and down_need < current else "within band")
        action = f"hold {current} ({why})"
        new = PolicyState(queue_over_at=queue_over_at, target_active=current, trend=trend,
                          last_scale_up_at=state.last_scale_up_at,
                          last_scale_down_at=state.last_scale_down_at,
                          latency_blind_until=state.latency_blind_until)

    pool = pool_for(target if pool_at is None else pool_at)
    refill = ""
    if load.standby < pool.hot or snapshot.warm_ready < pool.warm:
        refill = (f"; refill hot {load.standby}→{pool.hot}, "
                  f"warm {snapshot.warm_ready}→{pool.warm}")
    decision = ScaleDecision(
        target_active=target,
        target_standby={Tier.HOT: pool.hot, Tier.WARM: pool.warm, Tier.COLD: 0},
        reason=f"{action}: {signals}; {pool.reason}{refill}",
    )
    return decision, new
