"""How many standby replicas to keep per tier: dollars of idle capacity against SLO misses.

The model (deliberately simple, every term explicit):

* Demand. The arrival rate a horizon T from now is Normal(mu_T, sigma²) with
  mu_T = level + max(slope, 0)·T (the smoothed rate and its rising trend) and sigma the
  exponentially weighted spread of the observed rate around its level (RateTrend). A bursty
  past widens sigma, so the pool grows where traffic has shown it surges.
* Capacity. One replica serves `replica_rps` at the target utilisation. The `target_active`
  replicas cover H = target_active·replica_rps.
* The k-th hot standby is used within the warm start-up time T_warm when demand climbs past
  the active fleet plus the k-1 standbys before it:
      P_k = P(rate(T_warm) > H + (k-1)·replica_rps).
  When used it saves (T_warm - T_hot) seconds of a replica's work that would otherwise queue
  past the SLO: about replica_max_rps·(T_warm - T_hot) requests, each costing `slo_miss_usd`.
  Holding it costs hot_idle_usd_per_hour·T_warm/3600 over the same window. Keep the k-th while
      P_k · slo_miss_usd · replica_max_rps · (T_warm - T_hot)
          >  hot_idle_usd_per_hour · T_warm / 3600.
  P_k falls with k, so the first k that fails ends the pool.
* The j-th warm node is the same trade one tier down: demand past the active fleet and all
  hot standbys within the cold start-up time T_cold, saving (T_cold - T_warm) seconds of a
  replica, against warm_idle_usd_per_hour·T_cold/3600.
* The cold tier is unbounded and costs nothing idle, so it is never pooled.

New replicas come from the fastest tier first (tier_of, promotions): hot, warm, then cold.

Bounds per tier (min, max) clamp the result, and standbys never exceed max_replicas minus the
active target: a standby that can never be promoted is pure cost.

`hold_tier` keeps the counts from flapping (issue 14: eight standbys an hour ordered and
cancelled before they served on the Azure conversation trace).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from hbmserve.autoscale.signals import RateTrend
from hbmserve.core.scaling import Tier


@dataclass(frozen=True)
class PoolEconomics:
    hot_idle_usd_per_hour: float
    warm_idle_usd_per_hour: float
    slo_miss_usd: float


@dataclass(frozen=True)
class PoolSizing:
    hot: int
    warm: int
    reason: str


def prob_rate_exceeds(mu: float, sigma: float, threshold: float) -> float:
    if sigma <= 0.0:
        return 1.0 if mu > threshold else 0.0
    return 0.5 * math.erfc((threshold - mu) / (sigma * math.sqrt(2.0)))


NO_SURGE = (0.0, 0.0, 1.0, 0.0, 0.0)  # no step expected


def _count_worth_keeping(
    *,
    mu: float,
    sigma: float,
    covered_rps: float,
    replica_rps: float,
    saving_per_use_usd: float,
    idle_cost_usd: float,
    upper: int,
    surge: tuple[float, float, float, float, float] = NO_SURGE,
) -> tuple[int, float]:
    """How many standbys pay for themselves, and the use probability of the last one kept
    (or of the first one refused, when none is kept). surge: (probability of a step within
    the window, the rate it reaches, rps a standby carries during one, saving per use, rps
    the replicas ahead of this tier carry during one)."""
    p_step, step_rps, step_replica_rps, step_saving_usd, step_covered_rps = surge
    kept = 0
    probability = prob_rate_exceeds(mu, sigma, covered_rps)
    while kept < upper:
        probability = prob_rate_exceeds(mu, sigma, covered_rps + kept * replica_rps)
        value = probability * saving_per_use_usd
        if step_rps > step_covered_rps + kept * step_replica_rps and \
                p_step * step_saving_usd > value:
            probability, value = p_step, p_step * step_saving_usd
        if value <= idle_cost_usd:
            break
        kept += 1
    return kept, probability


def _surge(trend: RateTrend, window_s: float, prior_s: float, replica_max_rps: float,
           slo_miss_usd: float, saved_s: float,
           ahead: int) -> tuple[float, float, float, float, float]:
    # Steps as a Poisson process at the rate seen; the next one is assumed to reach the last
    # one's height. A standby only bridges a step until slower tiers arrive, so it is counted
    # at its full SLO capacity rather than at the target utilisation; so are the `ahead`
    # replicas already serving or faster to promote, which bridge the same minutes (counted
    # at the target utilisation they made the pool keep a warm node for a step that the
    # active replica and two hot standbys carried: issue 14). A step takes every tier at once,
    # so what a standby saves in one is measured against the cold start that serves the rest
    # of it, not against the next tier's start-up as for a drift.
    p_step = 1.0 - math.exp(-trend.surges_per_s(prior_s) * window_s)
    return (p_step, trend.step_rps, replica_max_rps, slo_miss_usd * replica_max_rps * saved_s,
            ahead * replica_max_rps)


def size_pool(
    *,
    target_active: int,
    trend: RateTrend,
    replica_rps: float,
    replica_max_rps: float,
    startup_s: dict[Tier, float],
    economics: PoolEconomics,
    hot_bounds: tuple[int, int],
    warm_bounds: tuple[int, int],
    max_replicas: int,
    surge_prior_s: float = 600.0,
    known_top_rps: float | None = None,
    steps: bool = True,
) -> PoolSizing:
    """The module docstring's model. `known_top_rps`: the rate is inside a burst like one seen
    before, whose top this is (envelope.known_peak): demand is taken to reach that top and no
    further (no spread around it, no step past it), and the active replicas count at their full
    capacity, as the known peak's replicas were sized. Without this the spread of the rate kept
    a hot standby beside a fleet that carried the top (burst-0: 0.5 replica on average).
    `steps` False: the burst envelope prices the steps already (it holds active replicas for
    the bursts it remembers, against what they miss), so they keep no standby here as well: on
    the lulls traces a step's standby sat beside the envelope's three replicas for 15 minutes
    (lulls-5: 0.76 GPU-h over a fixed fleet of 3)."""
    room = max(0, max_replicas - target_active)
    t_hot, t_warm, t_cold = startup_s[Tier.HOT], startup_s[Tier.WARM], startup_s[Tier.COLD]
    covered = target_active * (replica_rps if known_top_rps is None else replica_max_rps)
    if known_top_rps is not None:
        trend = replace(trend, variance=0.0, surge_level=min(trend.surge_level, known_top_rps),
                        step_peak=min(trend.step_peak, known_top_rps))
    top = float("inf") if known_top_rps is None else known_top_rps

    hot_saving = economics.slo_miss_usd * replica_max_rps * max(0.0, t_warm - t_hot)
    hot_idle = economics.hot_idle_usd_per_hour * t_warm / 3600.0
    mu_warm = min(trend.projected(t_warm), top)
    hot_model, p_hot = _count_worth_keeping(
        mu=mu_warm,
        sigma=trend.sigma,
        covered_rps=covered,
        replica_rps=replica_rps,
        saving_per_use_usd=hot_saving,
        idle_cost_usd=hot_idle,
        upper=min(hot_bounds[1], room),
        surge=_surge(trend, t_warm, surge_prior_s, replica_max_rps, economics.slo_miss_usd,
                     max(0.0, t_cold - t_hot), target_active) if steps else NO_SURGE,
    )
    hot = min(max(hot_model, hot_bounds[0]), hot_bounds[1], room)

    warm_saving = economics.slo_miss_usd * replica_max_rps * max(0.0, t_cold - t_warm)
    warm_idle = economics.warm_idle_usd_per_hour * t_cold / 3600.0
    mu_cold = min(trend.projected(t_cold), top)
    warm_room = max(0, room - hot)
    warm_model, p_warm = _count_worth_keeping(
        mu=mu_cold,
        sigma=trend.sigma,
        covered_rps=covered + hot * replica_rps,
        replica_rps=replica_rps,
        saving_per_use_usd=warm_saving,
        idle_cost_usd=warm_idle,
        upper=min(warm_bounds[1], warm_room),
        surge=_surge(trend, t_cold, surge_prior_s, replica_max_rps, economics.slo_miss_usd,
                     max(0.0, t_cold - t_warm), target_active + hot) if steps else NO_SURGE,
    )
    warm = min(max(warm_model, warm_bounds[0]), warm_bounds[1], warm_room)

    reason = (
        f"pool hot {hot} (P(use)={p_hot:.2f} × saves ${hot_saving:.3f} vs idle ${hot_idle:.3f}"
        f" per {t_warm:.0f}s; rate {mu_warm:.2f}±{trend.sigma:.2f} rps vs {covered:.2f} covered),"
        f" warm {warm} (P(use)={p_warm:.2f} × saves ${warm_saving:.3f} vs idle ${warm_idle:.3f}"
        f" per {t_cold:.0f}s)"
    )
    return PoolSizing(hot=hot, warm=warm, reason=reason)


@dataclass(frozen=True)
class PoolHold:
    """One tier's standby count after hysteresis: what is held, and the change pending.

    Ordering a standby starts a replica that bills from its order; cancelling it before it
    serves is churn (capacity/sim/evaluate.py counts it as a scale action). Sizing alone moves with
    every wobble of the rate's spread, so a count is changed only once the wish has stayed on
    one side of it for a delay: up after `up_delay_s`, to the lowest count wished meanwhile;
    down after `down_delay_s`, to the highest (Kubernetes HPA's stabilisation, both ways)."""

    held: int
    since: float | None = None  # when the wish left `held` on its current side
    pending: int = 0  # lowest wish since (a pending rise) or highest (a pending fall)


def hold_tier(hold: PoolHold | None, wish: int, now: float, up_delay_s: float,
              down_delay_s: float) -> PoolHold:
    if hold is None:  # nothing held yet: the first wish stands
        return PoolHold(wish)
    if wish == hold.held:
        return PoolHold(hold.held)
    up = wish > hold.held
    same_side = hold.since is not None and (hold.pending > hold.held) == up
    since = hold.since if same_side and hold.since is not None else now
    if not same_side:
        pending = wish
    else:
        pending = min(hold.pending, wish) if up else max(hold.pending, wish)
    if now - since >= (up_delay_s if up else down_delay_s):
        return PoolHold(pending)
    return PoolHold(hold.held, since, pending)


def tier_of(i: int, standby: int, warm_ready: int) -> Tier:
    """Tier the i-th new replica (1-based) comes from: the fastest one with capacity."""
    if i <= standby:
        return Tier.HOT
    if i <= standby + warm_ready:
        return Tier.WARM
    return Tier.COLD


def tier_sequence(standby: int, warm_ready: int) -> Callable[[int], Tier]:
    return lambda i: tier_of(i, standby, warm_ready)


def promotions(have: int, standby: int, warm_ready: int, target_active: int) -> dict[Tier, int]:
    """Where the replicas that take `have` (active + starting) to `target_active` come from."""
    plan: dict[Tier, int] = {}
    for i in range(1, target_active - have + 1):
        tier = tier_of(i, standby, warm_ready)
        plan[tier] = plan.get(tier, 0) + 1
    return plan
