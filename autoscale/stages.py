"""The stages of hbmserve's `decide` (policy.py), in the order it runs them:

    read_signals -> needs_of -> wish -> apply_hysteresis -> pool_for -> hold_pool -> explain

Each is a pure function of frozen values; only `apply_hysteresis` and `hold_pool` write the
policy's memory, through `dataclasses.replace`. policy.py's docstring says why each rule is
what it is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

from hbmserve.autoscale.envelope import (BurstEnvelope, EnvelopeFloor, KnownPeak, burst_floor, known_peak,
                                        observed_envelope)
from hbmserve.autoscale.memory.in_time import late_starts
from hbmserve.autoscale.signals import (Load, RateTrend, latency_need, load_of, p95, queue_need,
                                       update_trend)
from hbmserve.autoscale.warm_pool import (PoolEconomics, PoolHold, PoolSizing, hold_tier, promotions, size_pool,
                                          tier_of, tier_sequence)
from hbmserve.core.scaling import ReplicaState, Snapshot, Tier

if TYPE_CHECKING:  # policy.py imports this module; the types are only annotations here
    from hbmserve.autoscale.policy_config import AutoscaleConfig
    from hbmserve.autoscale.policy import PolicyState


def plan_promotions(snapshot: Snapshot, target_active: int) -> dict[Tier, int]:
    """Where the replicas that `target_active` adds come from: hot standbys, then warm
    nodes, then cold. Empty when nothing is to be added. The executor follows this."""
    have = snapshot.count(ReplicaState.ACTIVE) + snapshot.count(ReplicaState.STARTING)
    return promotions(have, snapshot.count(ReplicaState.STANDBY), snapshot.warm_ready,
                      target_active)


def rate_need(trend: RateTrend, current: int, replica_rps: float, tier_for: Callable[[int], Tier],
              startup_s: dict[Tier, float], max_replicas: int) -> int:
    """Fewest replicas n that carry the rate expected when the n-th could be ready.

    For n <= current the horizon is the time to get one back if n proves too few."""
    for n in range(0, max_replicas + 1):
        horizon = startup_s[tier_for(max(1, n - current))]
        if trend.projected(horizon) <= n * replica_rps:
            return n
    return max_replicas


@dataclass(frozen=True)
class Signals:
    """What one snapshot says, read once. `current` is the active target the policy set last
    (what runs, before its first decision); `floor` is min_replicas, or 1 while requests are
    held at the ingress."""

    now: float
    load: Load
    trend: RateTrend
    arrival_rps: float
    warm_ready: int
    current: int
    held: int | None  # the policy's last target; None before its first decision
    floor: int
    idle: bool  # nothing in flight and nothing arriving
    ttft_p95_s: float | None  # None: fewer samples than min_latency_samples
    ttft_samples: int
    tpot_p95_s: float | None  # None also when TPOT is no signal (no tpot_p95_target_s)
    tpot_samples: int
    blind: bool  # the latency samples predate the replicas the last scale-up added
    echo: bool  # the latency samples still carry the wait of a queue over target
    queue_over_at: float | None  # last time the queue was over target
    envelope: BurstEnvelope | None  # None: the envelope is off (burst_memory_s 0)

    @property
    def muted(self) -> bool:
        return self.blind or self.echo

    def tier_for(self, i: int) -> Tier:
        """Tier the i-th new replica would come from."""
        return tier_of(i, self.load.standby, self.warm_ready)


def read_signals(snapshot: Snapshot, config: AutoscaleConfig, state: PolicyState) -> Signals:
    now = snapshot.now
    load = load_of(snapshot)
    trend = update_trend(state.trend, now, snapshot.arrival_rate_rps,
                         fast_tau_s=config.rate_smoothing_s, slow_tau_s=config.trend_window_s,
                         variance_tau_s=config.rate_variance_window_s,
                         slope_tau_s=config.slope_noise_window_s, z=config.trend_z)
    # A latency over target while requests queue past the target is the queue's wait showing up
    # late; queue_need already sizes that backlog (with what drains before help arrives), and
    # scaling on its echo as well ordered 2x the fleet after every burst had passed.
    # The samples cover look_back_s, so the echo outlasts the queue by that long.
    queued_over = load.waiting + load.pending > config.target_queue_per_replica * load.active
    queue_over_at = now if queued_over else state.queue_over_at
    enough = config.min_latency_samples
    ttft, tpot = snapshot.ttft_samples_s, snapshot.tpot_samples_s
    return Signals(
        now=now, load=load, trend=trend, arrival_rps=snapshot.arrival_rate_rps,
        warm_ready=snapshot.warm_ready,
        current=state.target_active if state.target_active is not None
        else load.active + load.starting,
        held=state.target_active,
        floor=max(config.min_replicas, 1 if load.pending > 0 else 0),
        idle=load.in_flight == 0 and snapshot.arrival_rate_rps <= 0.0,
        ttft_p95_s=p95(ttft) if len(ttft) >= enough else None, ttft_samples=len(ttft),
        tpot_p95_s=p95(tpot) if config.tpot_p95_target_s is not None and len(tpot) >= enough
        else None,
        tpot_samples=len(tpot),
        blind=state.latency_blind_until is not None and now < state.latency_blind_until,
        echo=queue_over_at is not None and now - queue_over_at < config.look_back_s,
        queue_over_at=queue_over_at,
        envelope=observed_envelope(state.envelope, now, snapshot.arrival_rate_rps, config),
    )


@dataclass(frozen=True)
class Needs:
    """Replicas (active and starting, in all) each signal asks for; 0: no reason to grow."""

    rate: int  # the forecast
    queue: int
    ttft: int
    tpot: int
    ingress: int  # 1 while requests are held with no active replica
    burst: EnvelopeFloor | None = None  # what the burst envelope holds; None: off
    known: KnownPeak | None = None  # the rate is within a peak seen before: `rate` is capped to it
    forecast: int = 0  # the trend's need before that cap

    @property
    def symptom(self) -> int:
        """The most any observed symptom asks for, the forecast left out."""
        return max(self.queue, self.ttft, self.tpot, self.ingress)


def needs_of(signals: Signals, config: AutoscaleConfig) -> Needs:
    startup = config.startup_s
    help_s = startup[signals.tier_for(1)]
    # A backlog left when help arrives must be gone within one more start-up of that help: fast
    # help (a hot standby) is no excuse for a slow drain, and a queued request waits for the
    # whole drain, so never longer than backlog_drain_s nor asked faster than the TTFT target.
    drain_s = min(config.backlog_drain_s, max(config.ttft_p95_target_s, help_s))
    capacity, load = config.replica_capacity_rps, signals.load
    forecast = 0 if signals.idle else rate_need(
        signals.trend, signals.current, capacity * config.target_utilization,
        signals.tier_for, startup, config.max_replicas)
    burst = burst_floor(signals.envelope, config, held=signals.held)
    known = known_peak(signals.envelope, signals.arrival_rps, config, burst)
    return Needs(
        rate=forecast if known is None else min(forecast, known.replicas),
        forecast=forecast, known=known,
        queue=queue_need(load, config.target_queue_per_replica, arrival_rps=signals.arrival_rps,
                         replica_rps=capacity, horizon_s=help_s, drain_s=drain_s),
        ttft=latency_need(signals.ttft_p95_s, config.ttft_p95_target_s, load.active,
                          config.max_latency_growth, signals.muted),
        tpot=0 if tpot_unreachable(config) else latency_need(
            signals.tpot_p95_s, config.tpot_p95_target_s, load.active, config.max_latency_growth,
            signals.muted),
        ingress=1 if load.pending > 0 else 0,
        burst=burst,
    )


def tpot_unreachable(config: AutoscaleConfig) -> bool:
    """The TPOT target is at or below what one sequence decoding alone takes with these engine
    settings: no replica count reaches it (policy.py, "TPOT need")."""
    return (config.tpot_p95_target_s is not None and config.tpot_floor_s is not None
            and config.tpot_floor_s >= config.tpot_p95_target_s)


@dataclass(frozen=True)
class Wish:
    """Where the fleet would go with no hysteresis."""

    up: int  # the highest need (or the floor), within max_replicas
    down: int  # replicas the rate fits in at downscale_utilization (0 when idle)
    slack: bool  # every symptom well under target: a scale-down may be considered
    symptom: bool  # a symptom, not the forecast alone, asks for more than `current`


def wish(needs: Needs, signals: Signals, config: AutoscaleConfig) -> Wish:
    load = signals.load
    # The envelope is a forecast: it orders replicas ahead of the next burst (with the
    # forecast's delay) and is the least a scale-down keeps.
    burst = needs.burst.replicas if needs.burst is not None else 0
    tpot_target = config.tpot_p95_target_s
    p_ttft, p_tpot = signals.ttft_p95_s, signals.tpot_p95_s
    return Wish(
        up=min(max(needs.rate, needs.symptom, signals.floor, burst), config.max_replicas),
        down=max(burst, 0 if signals.idle else max(1, rate_need(
            signals.trend, signals.current,
            config.replica_capacity_rps * config.downscale_utilization, signals.tier_for,
            config.startup_s, config.max_replicas))),
        slack=(
            load.pending == 0
            and load.queue_per_active
            <= config.target_queue_per_replica * config.queue_down_fraction
            and (p_ttft is None or p_ttft <= config.ttft_p95_target_s * config.ttft_down_fraction)
            and (p_tpot is None or tpot_target is None
                 or p_tpot <= tpot_target * config.tpot_down_fraction)
            and load.mean_kv_usage <= config.kv_usage_down_max
        ),
        symptom=needs.symptom > signals.current,
    )


def pool_for(signals: Signals, config: AutoscaleConfig, active: int,
             known: KnownPeak | None = None) -> PoolSizing:
    """Standbys per tier worth keeping beside `active` replicas (warm_pool.size_pool); inside a
    known burst (`known`) none is kept for a climb past its top."""
    return size_pool(
        target_active=active, trend=signals.trend,
        replica_rps=config.replica_capacity_rps * config.target_utilization,
        replica_max_rps=config.replica_capacity_rps, startup_s=config.startup_s,
        economics=PoolEconomics(config.hot_idle_usd_per_hour, config.warm_idle_usd_per_hour,
                                config.slo_miss_usd),
        hot_bounds=(config.hot_standby_min, config.hot_standby_max),
        warm_bounds=(config.warm_pool_min, config.warm_pool_max),
        max_replicas=config.max_replicas,
        known_top_rps=None if known is None else known.peak_rps,
        # Once the envelope remembers a bucket it prices the steps (warm_pool.size_pool).
        steps=signals.envelope is None or not signals.envelope.rises_rps,
    )


def hold_pool(pool: PoolSizing, signals: Signals, state: PolicyState, config: AutoscaleConfig,
              active: int) -> tuple[PoolSizing, PolicyState]:
    """The pool sizing once it has lasted (warm_pool.hold_tier): ordering a standby waits
    `rate_upscale_delay_s`, as a forecast-only scale-up does; cancelling or retiring one waits
    `downscale_delay_s`, as a scale-down does. A change that orders and cancels nothing is
    applied at once: replicas this decision takes out of service may join the hot pool (a
    demotion), and standbys it promotes leave the pool (hot first, as plan_promotions takes
    them) instead of being ordered again. Bounds, and the room left beside `active` under
    max_replicas, apply at once."""
    now, up_s, down_s = signals.now, config.rate_upscale_delay_s, config.downscale_delay_s
    hot = hold_tier(state.pool_hot, pool.hot, now, up_s, down_s)
    warm = hold_tier(state.pool_warm, pool.warm, now, up_s, down_s)
    demoted = max(0, signals.current - active)
    if demoted and pool.hot > hot.held:
        hot = _moved(hot, min(pool.hot, hot.held + demoted), pool.hot)
    promoted = max(0, active - signals.current)
    if promoted and pool.hot < hot.held:  # promotions take hot standbys first
        taken = min(promoted, hot.held - pool.hot)
        hot, promoted = _moved(hot, hot.held - taken, pool.hot), promoted - taken
    if promoted and pool.warm < warm.held:
        warm = _moved(warm, warm.held - min(promoted, warm.held - pool.warm), pool.warm)
    room = max(0, config.max_replicas - active)
    hot_n = min(max(hot.held, config.hot_standby_min), config.hot_standby_max, room)
    warm_n = min(max(warm.held, config.warm_pool_min), config.warm_pool_max, room - hot_n)
    hot = hot if hot_n == hot.held else PoolHold(hot_n)
    warm = warm if warm_n == warm.held else PoolHold(warm_n)
    reason = pool.reason
    if (hot_n, warm_n) != (pool.hot, pool.warm):
        reason += (f"; held at hot {hot_n}, warm {warm_n} (sized hot {pool.hot}, warm "
                   f"{pool.warm}: a change waits {up_s:g}s up, {down_s:g}s down)")
    return PoolSizing(hot_n, warm_n, reason), replace(state, pool_hot=hot, pool_warm=warm)


def _moved(hold: PoolHold, held: int, wished: int) -> PoolHold:
    """`hold` moved to `held` at once; what is still pending toward `wished` stays pending."""
    return PoolHold(held) if held == wished else replace(hold, held=held)


@dataclass(frozen=True)
class Outcome:
    target: int  # active replicas
    action: str  # what was done and why, the head of the reason
    state: PolicyState
    not_in_time: int = 0  # replicas asked for and not ordered: they would arrive late


def apply_hysteresis(wanted: Wish, signals: Signals, state: PolicyState,
                     config: AutoscaleConfig) -> Outcome:
    """The wish, once it has lasted long enough; the timers live in PolicyState."""
    now, current = signals.now, signals.current
    # Every branch carries the signals' memory and clears the timers it does not run.
    base = replace(state, trend=signals.trend, queue_over_at=signals.queue_over_at,
                   envelope=signals.envelope,
                   up_since=None, down_since=None, down_floor=0)
    if current > config.max_replicas:
        target = config.max_replicas
        return Outcome(target, f"down {current}→{target} (max_replicas)",
                       replace(base, target_active=target, last_scale_down_at=now))
    if wanted.up > current:
        return _toward_up(wanted, signals, state, base, config)
    down_to = max(wanted.down, signals.floor)
    if wanted.slack and down_to < current:
        return _toward_down(down_to, signals, state, base, config)
    why = "symptoms not slack" if not wanted.slack and wanted.down < current else "within band"
    return Outcome(current, f"hold {current} ({why})", replace(base, target_active=current))


def _toward_up(wanted: Wish, signals: Signals, state: PolicyState, base: PolicyState,
               config: AutoscaleConfig) -> Outcome:
    now, current, load = signals.now, signals.current, signals.load
    since = state.up_since if state.up_since is not None else now
    urgent = current < signals.floor  # below the floor is acted on at once
    delay = config.upscale_delay_s if wanted.symptom else config.rate_upscale_delay_s
    if not urgent and now - since < delay:
        return Outcome(current, f"hold {current}, up to {wanted.up} pending "
                                f"({now - since:.1f}/{delay:g}s)",
                       replace(base, target_active=current, up_since=since))
    target = wanted.up
    plan = promotions(load.active + load.starting, load.standby, signals.warm_ready, target)
    # Cold replicas for a burst they would arrive after are not ordered; faster tiers still are.
    # The burst's age: since the envelope saw it start, else since the wish began.
    env = signals.envelope
    began = env.burst_from if env is not None and env.burst_from is not None else since
    late = None if urgent else late_starts(
        plan.get(Tier.COLD, 0), config.startup_s[Tier.COLD], burst_age_s=now - began,
        rate_rps=signals.arrival_rps, env=env, config=config)
    if late is not None:
        target -= late.dropped
        plan = {t: n for t, n in plan.items() if t is not Tier.COLD}
        if target <= current:
            return Outcome(current, f"hold {current} ({late.describe()})",
                           replace(base, target_active=current, up_since=since), late.dropped)
    tiers = ", ".join(f"{n} {t.value}" for t, n in plan.items()) or "already starting"
    tiers += f"; {late.describe()}" if late is not None else ""
    why = ""
    if urgent:
        why = (" from zero: requests held at the ingress" if current == 0 and load.pending
               else f" to min_replicas {config.min_replicas}")
    # TTFT and TPOT samples describe the past: they are ignored until the slowest new replica
    # can have served a whole look-back window.
    slowest = max((config.startup_s[t] for t in plan), default=0.0)
    return Outcome(target, f"up {current}→{target} ({tiers}){why}",
                   replace(base, target_active=target, last_scale_up_at=now,
                           starts_ready_at=now + slowest,
                           latency_blind_until=now + slowest + config.look_back_s),
                   late.dropped if late is not None else 0)


def _toward_down(down_to: int, signals: Signals, state: PolicyState, base: PolicyState,
                 config: AutoscaleConfig) -> Outcome:
    now, current = signals.now, signals.current
    waiting_down = state.down_since is not None
    since = state.down_since if waiting_down else now
    # The highest need seen while waiting is the one applied (a stabilisation window).
    down_floor = max(state.down_floor, down_to) if waiting_down else down_to
    delay = config.downscale_delay_s
    if down_floor == 0 and config.scale_to_zero_delay_s is not None:
        delay = config.scale_to_zero_delay_s
    waited = now - since >= delay
    # No scale-down within the cool-down of a scale-up, nor before the replicas it ordered
    # serve: cancelling a start is churn (issue 14), so an order, once placed, is kept.
    cooled = ((state.last_scale_up_at is None
               or now - state.last_scale_up_at >= config.downscale_cooldown_s)
              and (state.starts_ready_at is None or now >= state.starts_ready_at))
    if waited and cooled:
        # The surplus actives are not lost: as many as the hot pool lacks are demoted into it
        # (live: roles.assign_roles, Serve keeps active + hot running; the simulator: scale_down),
        # engines loaded, promotable at once. So nothing needs to linger as active.
        return Outcome(down_floor, f"down {current}→{down_floor} (slack for {now - since:.0f}s)",
                       replace(base, target_active=down_floor, last_scale_down_at=now))
    why = "cool-down after scale-up" if waited else f"{now - since:.0f}/{delay:g}s"
    return Outcome(current, f"hold {current}, down to {down_floor} pending ({why})",
                   replace(base, target_active=current, down_since=since, down_floor=down_floor))


def explain(outcome: Outcome, signals: Signals, needs: Needs, pool: PoolSizing,
            config: AutoscaleConfig) -> str:
    """The decision's reason: the action, every signal with its need, the pool."""
    load, trend = signals.load, signals.trend
    ignored = " (ignored: new replicas not yet reflected)" if signals.blind else ""
    p = signals.ttft_p95_s
    ttft = "no p95 TTFT" if p is None else (
        f"p95 TTFT {p:.2f}s/{config.ttft_p95_target_s:.2f}s from {signals.ttft_samples} "
        f"samples{ignored}")
    p_tpot, tpot_target = signals.tpot_p95_s, config.tpot_p95_target_s
    if tpot_target is None:
        tpot = "TPOT not a signal"
    elif p_tpot is None:
        tpot = "no p95 TPOT"
    else:
        tpot = (f"p95 TPOT {1000 * p_tpot:.0f}ms/{1000 * tpot_target:.0f}ms from "
                f"{signals.tpot_samples} samples{ignored}")
    if tpot_unreachable(config):
        tpot += (f" (not chased: one sequence alone decodes at {1000 * config.tpot_floor_s:.0f}ms "
                 f"with these engine settings, replicas cannot fix it)")
    known = ""
    if needs.known is not None and needs.rate < needs.forecast:
        known = f", not {needs.forecast}: {needs.known.describe()}"
    refill = ""
    if load.standby < pool.hot or signals.warm_ready < pool.warm:
        refill = (f"; refill hot {load.standby}→{pool.hot}, "
                  f"warm {signals.warm_ready}→{pool.warm}")
    return (
        f"{outcome.action}: "
        f"rate {trend.level:.2f} rps ±{trend.sigma:.2f}, trend {trend.slope:+.4f}/s "
        f"(trusted {trend.trusted_slope:+.4f}/s) "
        f"(need {needs.rate} at {config.replica_capacity_rps * config.target_utilization:.2f}"
        f" rps/replica{known}); queue {load.queue_per_active:.1f}/replica vs "
        f"{config.target_queue_per_replica:g} (need {needs.queue}); "
        f"{needs.burst.describe() + '; ' if needs.burst is not None else ''}{ttft} "
        f"(need {needs.ttft}); {tpot} (need {needs.tpot}); kv {load.mean_kv_usage:.2f}; "
        f"active {load.active} starting {load.starting} standby {load.standby} "
        f"pending {load.pending}; {pool.reason}{refill}"
    )
