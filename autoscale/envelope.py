"""The traffic's burst envelope, learned online: how far the arrival rate climbs within one
start-up horizon, over the last tens of minutes, and the replicas worth holding for it (issue
27, requirement 2).

Why: real services alternate bursts of 1-3 minutes with lulls of 1-5 minutes. A policy that
follows the current rate scales down in every lull, and the next burst arrives before a cold
start can finish: on the Azure code trace hbmserve v2 was dominated by a fixed fleet of 3.
Capacity let go in a lull comes back only a start-up later, so what the fleet must hold is not
the rate now but the peak it may meet before a replica let go now could be back.

The model, every term explicit:

* Buckets. Time is cut into buckets one cold start-up long (`bucket_s`, at least one
  look-back): a replica let go at the start of a bucket is back at the earliest at its end.
  Each bucket records its rise: the highest arrival rate (the look-back mean the snapshot
  reports) above the lowest one of that bucket and the two before (so a rise that starts near a
  bucket's end is seen whole, and a burst longer than a bucket is still measured from the lull
  it rose from), and what it would have missed at each headroom over its base (memory/backlog.py: a
  fluid queue per headroom fed the same rate). The last `memory_s` of live buckets are kept
  and older ones forgotten, so the envelope follows a diurnal drift with that lag; a prior's
  buckets (the service's past) are kept for good beside them. The first look-back window is
  not observed: its rate climbs from nothing while the window fills, which is no burst.
* Peaks. Were a bucket like one of those to start now, its peak would be base + rise, with base
  the lowest rate of the last one to three buckets (where a burst would rise from). Two buckets
  were too few: inside a 5-minute burst both were the burst, and the floor held for a second
  burst on top of it (burst-0: 5 replicas held for a 45 rps "peak" where 25 was the top).
* Misses. A bucket with curves misses, with n replicas (mu = n·c requests/s, c: one replica's
  capacity at the SLO), what its backlog missed at headroom mu - base now: its own shape, so a
  top touched for seconds costs what it cost, not what a top held for minutes would. A bucket
  known only by its rise (a prior learnt before the curves) is priced as a rectangle: its peak
  taken to last L = `length_s` (burst_length_s, 90 s: real bursts last 1-3
  minutes, and the backlog a peak leaves takes about as long to drain). n replicas serve
  mu = n·c requests/s (c: one replica's capacity at the SLO). A peak lambda over mu queues
  (lambda - mu)·t requests after t seconds, and a request misses once that queue takes longer
  than the TTFT target to drain: after t* = mu·TTFT/(lambda - mu). So a bucket with that peak
  misses about lambda·max(0, L - t*) requests with n replicas. A peak that brushes past
  capacity misses nothing (the queue drains within the target); one several replicas over
  misses nearly all of its L seconds.
* Worth. Hold the n that minimises, per bucket, what holding costs plus what it misses on
  average over the kept buckets:
      n · replica_usd_per_hour · bucket_s / 3600  +  mean_k misses_k(n) · slo_miss_usd.
  The pool's economics price both (warm_pool.py: 10 $/h a replica against 0.01 $ a miss, so a
  replica held through a 180-s bucket must save 50 misses on average over the buckets). Each
  replica the hold adds to or takes from the policy's current target also pays one bucket's
  hold (a start, now or when the next burst calls it back): a hold near the break-even then
  stays put instead of flapping by one replica, a cold start each time.
* Floor. The policy scales down only to the replicas held, and orders up to them ahead of the
  next burst (a forecast, so with the forecast's delay).

Pure: time arrives as data; the state is a frozen value kept in PolicyState.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from hbmserve.autoscale.memory import backlog

if TYPE_CHECKING:  # policy_config imports nothing from here; the type is only an annotation
    from hbmserve.autoscale.policy_config import AutoscaleConfig


@dataclass(frozen=True)
class BurstEnvelope:
    """How far the arrival rate rose within each bucket (closed buckets oldest first, then the
    open one), and the lowest rate of the open bucket and the two before it."""

    bucket_started_at: float
    open_rise_rps: float = 0.0
    open_min_rps: float | None = None  # None: no sample in the open bucket yet
    previous_min_rps: float | None = None
    rises_rps: tuple[float, ...] = ()
    earlier_min_rps: float | None = None  # the bucket before the previous one
    # When the rate last came down by half of what its bucket had risen: it does after a burst
    # and in noise, never on a steady ramp. None: not within the memory.
    fell_at: float | None = None
    # Bursts: the rate risen from the base by at least half the largest closed rise, until it is
    # back under a quarter of it. When the one under way began (None: none is), and how long the
    # last ones lasted (oldest first).
    burst_from: float | None = None
    lengths_s: tuple[float, ...] = ()
    # What each closed bucket missed per headroom over its base (memory/backlog.py), aligned with
    # rises_rps; None for a bucket only its rise is known of (a prior learnt before the curves),
    # which is priced by the rectangle (peak_misses). step_rps 0: no curves are measured.
    step_rps: float = 0.0
    misses: tuple[tuple[float, ...] | None, ...] = ()
    open_misses: tuple[float, ...] = ()
    queues: tuple[float, ...] = ()  # the fluid backlog per headroom, carried across buckets
    seen_at: float | None = None  # the last sample's time
    # The first this many buckets are the prior's (the service's past, autoscale/memory/prior.py):
    # never forgotten, so a quiet half hour does not erase what yesterday's bursts taught.
    prior_buckets: int = 0
    # Where the prior's bursts rose from (the median base of its buckets): the base until the
    # live memory holds three buckets' lows of its own. None: no prior, or one without it.
    prior_base_rps: float | None = None

    @property
    def base_rps(self) -> float:
        """The lowest rate of the last one to three buckets: where a burst would rise from."""
        mins = [m for m in (self.earlier_min_rps, self.previous_min_rps, self.open_min_rps) if m is not None]
        if self.earlier_min_rps is None and self.prior_base_rps is not None:
            mins.append(self.prior_base_rps)  # the first rate seen may be a burst's, not a lull's
        return min(mins) if mins else 0.0

    @property
    def peaks_rps(self) -> tuple[float, ...]:
        """Each kept bucket's rise on top of the base now, the open bucket last."""
        base = self.base_rps
        return tuple(base + r for r in (*self.rises_rps, self.open_rise_rps))

    @property
    def backlog_priced(self) -> bool:
        """Whether the curves and the start cost price the hold: only once a prior is held
        (bucket_misses says why); before that, the rectangle and no start cost."""
        return self.prior_buckets > 0

    @property
    def curves(self) -> tuple[tuple[float, ...] | None, ...]:
        """Each kept bucket's misses per headroom (None: unknown), the open bucket last."""
        closed_ones = self.misses if len(self.misses) == len(self.rises_rps) else (None,) * len(self.rises_rps)
        return (*closed_ones, self.open_misses if self.step_rps > 0 else None)

    def observe(self, now: float, rate_rps: float, bucket_s: float,
                memory_s: float, ttft_s: float = 0.0) -> BurstEnvelope:
        """The envelope with one more rate sample at `now` (`ttft_s`: the target the backlog's
        misses are counted against; used only when the envelope measures curves)."""
        if now < self.bucket_started_at:  # the look-back window is still filling
            return self
        env = self
        keep = max(1, math.ceil(memory_s / bucket_s))
        while now >= env.bucket_started_at + bucket_s:  # close the buckets that ended
            closed_at = env.bucket_started_at + bucket_s
            forgotten = env.fell_at is not None and closed_at - env.fell_at > memory_s
            p = env.prior_buckets
            curves = env.curves
            env = BurstEnvelope(closed_at, previous_min_rps=env.open_min_rps,
                                earlier_min_rps=env.previous_min_rps,
                                rises_rps=(*env.rises_rps[:p], *(*env.rises_rps[p:], env.open_rise_rps)[-keep:]),
                                fell_at=None if forgotten else env.fell_at,
                                burst_from=env.burst_from, lengths_s=env.lengths_s,
                                step_rps=env.step_rps, misses=(*curves[:p], *(*curves[p:-1], env.closed_curve)[-keep:]),
                                queues=env.queues, seen_at=env.seen_at, prior_buckets=p,
                                prior_base_rps=env.prior_base_rps)
        seen = any(m is not None for m in (env.open_min_rps, env.previous_min_rps, env.earlier_min_rps))
        rise = rate_rps - min(env.base_rps, rate_rps) if seen else 0.0
        # Come down by half of what this bucket rose: a burst ended, or noise wobbled (its top,
        # the noise band, is then known too). A ramp only climbs.
        fell = env.open_rise_rps > 0 and rise < 0.5 * env.open_rise_rps
        low = rate_rps if env.open_min_rps is None else min(env.open_min_rps, rate_rps)
        burst_from, lengths = env.burst_from, env.lengths_s
        biggest = max(env.rises_rps, default=0.0)
        # In at half the largest rise, out only below a quarter: noise about one threshold
        # would cut a burst into blips of a second or two.
        in_burst = biggest > 0 and rise >= (0.5 if burst_from is None else 0.25) * biggest
        if in_burst and burst_from is None:
            burst_from = now
        elif not in_burst and burst_from is not None:
            burst_from, lengths = None, (*lengths, now - burst_from)[-keep:]
        queues, misses = env.queues, env.open_misses
        if env.step_rps > 0 and env.seen_at is not None:
            queues, misses = backlog.advance(queues, misses, rate_rps=rate_rps, base_rps=env.base_rps,
                                             dt_s=now - env.seen_at, step_rps=env.step_rps, ttft_s=ttft_s)
        return replace(env, open_rise_rps=max(env.open_rise_rps, rise), open_min_rps=low,
                       fell_at=now if fell else env.fell_at, burst_from=burst_from, lengths_s=lengths,
                       queues=queues, open_misses=misses, seen_at=now)

    @property
    def closed_curve(self) -> tuple[float, ...] | None:
        """The open bucket's misses as a closed bucket keeps them; None: not measured."""
        return backlog.closed(self.open_misses) if self.step_rps > 0 else None

    @classmethod
    def from_dict(cls, values: dict) -> BurstEnvelope:
        def rate(name: str) -> float | None:
            v = values.get(name)
            return None if v is None else float(v)

        def floats(name: str) -> tuple[float, ...]:
            return tuple(float(v) for v in values.get(name, ()))

        return cls(float(values["bucket_started_at"]), float(values.get("open_rise_rps", 0.0)),
                   rate("open_min_rps"), rate("previous_min_rps"), floats("rises_rps"), rate("earlier_min_rps"),
                   rate("fell_at"), rate("burst_from"), floats("lengths_s"),
                   step_rps=float(values.get("step_rps", 0.0)), prior_buckets=int(values.get("prior_buckets", 0)),
                   prior_base_rps=rate("prior_base_rps"),
                   misses=tuple(None if c is None else tuple(float(v) for v in c) for c in values.get("misses", ())),
                   open_misses=floats("open_misses"), queues=floats("queues"), seen_at=rate("seen_at"))


@dataclass(frozen=True)
class EnvelopeFloor:
    replicas: int
    peak_rps: float  # the highest kept peak
    misses_per_bucket: float  # expected, with `replicas` held
    buckets: int

    def describe(self) -> str:
        return (f"burst envelope: peak {self.peak_rps:.2f} rps over {self.buckets} buckets, "
                f"hold {self.replicas} ({self.misses_per_bucket:.1f} misses/bucket expected)")


def peak_misses(peak_rps: float, capacity_rps: float, length_s: float, ttft_s: float) -> float:
    """Requests a `length_s`-long peak misses on `capacity_rps` (the docstring's "Misses")."""
    if peak_rps <= capacity_rps:
        return 0.0
    if capacity_rps <= 0:
        return peak_rps * length_s
    missing_after_s = capacity_rps * ttft_s / (peak_rps - capacity_rps)
    return peak_rps * max(0.0, length_s - missing_after_s)


def bucket_misses(env: BurstEnvelope, capacity_rps: float, *, length_s: float, ttft_s: float,
                  bucket_s: float) -> tuple[float, ...]:
    """What each kept bucket, the open one last, would miss were it to come again with
    `capacity_rps` over the base now: its fluid backlog's count (memory/backlog.py) once the memory
    holds a prior, else the rectangle (the module docstring's "Misses").

    Why only with a prior: the fluid count is a fair mean only over a memory that has seen the
    traffic's tail. Half an hour of live buckets often has not: without a prior it held 2
    replicas through lulls-1's mild first half and lost 11 points to v3 there (8 on lulls-2).
    The rectangle's pessimism is the insurance until a prior brings the past's bursts."""
    base = env.base_rps
    return tuple(peak_misses(base + rise, capacity_rps, length_s, ttft_s) if curve is None or not env.backlog_priced
                 else backlog.missed_at(curve, capacity_rps - base, env.step_rps, bucket_s)
                 for rise, curve in zip((*env.rises_rps, env.open_rise_rps), env.curves))


def envelope_floor(env: BurstEnvelope, *, replica_rps: float, replica_usd_per_hour: float,
                   slo_miss_usd: float, bucket_s: float, length_s: float, ttft_s: float,
                   max_replicas: int, held: int | None = None) -> EnvelopeFloor:
    """Replicas worth holding for the envelope's buckets (the module docstring's "Worth"), from
    `held` now (None: from nothing)."""
    hold_usd = replica_usd_per_hour * bucket_s / 3600.0

    def misses(n: int) -> float:
        each = bucket_misses(env, n * replica_rps, length_s=length_s, ttft_s=ttft_s, bucket_s=bucket_s)
        return sum(each) / len(each)

    def switch_usd(n: int) -> float:
        # Each replica the hold adds or lets go pays one start (a bucket is one start-up long):
        # now, or when the next burst calls it back. Without it the hold flapped by one replica
        # on every small change of the mean, and each flap was a cold start billed for nothing.
        return 0.0 if held is None else abs(n - held) * hold_usd

    # Scan every count: the misses fall in steps, so the cost need not be convex.
    best = min(range(max_replicas + 1),
               key=lambda n: (n * hold_usd + misses(n) * slo_miss_usd + switch_usd(n), n))
    return EnvelopeFloor(best, max(env.peaks_rps), misses(best), len(env.peaks_rps))


def observed_envelope(env: BurstEnvelope | None, now: float, rate_rps: float,
                      config: AutoscaleConfig) -> BurstEnvelope | None:
    """`env` with the snapshot's rate at `now`; None when the envelope is off (burst_memory_s 0)."""
    if config.burst_memory_s <= 0:
        return None
    # The first look-back window's rate climbs from nothing as the window fills: no burst. The
    # memory starts from the prior, if any: the service's past (autoscale/memory/prior.py).
    if env is None:
        keep = max(1, math.ceil(config.burst_memory_s / bucket_of(config)))
        rises = config.prior_rises_rps[-keep:]
        # A past with lulls as well as bursts (some bucket rose under half the most) came down
        # from its tops; a past that only climbed did not.
        fell = bool(rises) and min(rises) < 0.5 * max(rises)
        env = BurstEnvelope(bucket_started_at=now + config.look_back_s, rises_rps=rises,
                            fell_at=now if fell else None, lengths_s=config.prior_lengths_s[-keep:],
                            step_rps=backlog.step_of(config.replica_capacity_rps),
                            misses=prior_curves(config)[-keep:], prior_buckets=len(rises),
                            prior_base_rps=config.prior_base_rps)
    return env.observe(now, rate_rps, bucket_of(config), config.burst_memory_s, config.ttft_p95_target_s)


def prior_curves(config: AutoscaleConfig) -> tuple[tuple[float, ...] | None, ...]:
    """The prior's misses per headroom on this config's grid; None for each bucket when the prior
    has none (learnt before they were)."""
    if len(config.prior_misses) != len(config.prior_rises_rps):
        return (None,) * len(config.prior_rises_rps)
    step = backlog.step_of(config.replica_capacity_rps)
    return tuple(backlog.regrid(c, config.prior_miss_step_rps, step) for c in config.prior_misses)


def burst_floor(env: BurstEnvelope | None, config: AutoscaleConfig,
                held: int | None = None) -> EnvelopeFloor | None:
    """Replicas the burst envelope asks to hold, `held` now; None when it is off."""
    if env is None:
        return None
    # A held replica is priced as a hot standby is: loaded, idle, billed.
    return envelope_floor(env, replica_rps=config.replica_capacity_rps,
                          replica_usd_per_hour=config.hot_idle_usd_per_hour,
                          slo_miss_usd=config.slo_miss_usd, bucket_s=bucket_of(config),
                          length_s=config.burst_length_s, ttft_s=config.ttft_p95_target_s,
                          # The start cost keeps a hold; on a memory without a prior it kept
                          # an early one too long (azure-conv: 100.00% -> 99.32%).
                          max_replicas=config.max_replicas, held=held if env.backlog_priced else None)


@dataclass(frozen=True)
class KnownPeak:
    """The highest peak the envelope has seen, while the rate is within it: a burst like one
    seen before, whose top is known, so the trend need not be projected past it."""

    # The top the fleet must cover: the base now plus the largest closed rise, or, `by_curves`,
    # what the curves' hold carries.
    peak_rps: float
    replicas: int  # worth holding for that peak (the docstring's "Worth", for this one peak)
    by_curves: bool = False  # the buckets' own backlogs say `replicas` miss none of the peaks

    def describe(self) -> str:
        if self.by_curves:
            return f"within the known peaks: the burst envelope's {self.replicas} miss none of them"
        return f"within the known peak {self.peak_rps:.2f} rps: {self.replicas} hold it"


# Expected misses a bucket under which the curves count a hold as missing nothing.
NO_MISSES = 1.0


def known_peak(env: BurstEnvelope | None, rate_rps: float, config: AutoscaleConfig,
               floor: EnvelopeFloor | None = None) -> KnownPeak | None:
    """The replicas worth holding for the highest peak seen (closed buckets and the prior), when
    the rate now is at or under it; None: no burst seen yet, or the rate is past every one seen.

    Why: inside a burst the trend climbs, and projected over a cold start it orders the replicas
    for a rate twice the top (burst-0: 24 rps rising, 6 replicas ordered where 3 carried the 25
    rps top), which then arrive as the burst ends. A burst's top, once seen, is the better
    forecast; a rise past it is a new level and the trend is followed again. A top is known only
    once the rate has been seen to come down (`fell_at`): on a steady ramp the rate always sits
    at the top of what the last buckets saw, and only the trend sees where it goes.

    Where the curves price the hold (a prior is held) and the envelope's `floor` expects no miss
    in any bucket, the largest burst included, those replicas carry the peak: its top is touched
    for less than the TTFT target's backlog. The rectangle would still ask for one more, which
    came up after every such top and went down a bucket later (lulls-5: 0.53 GPU-h over a fixed
    fleet of 3 at its attainment)."""
    if env is None or not env.rises_rps or env.fell_at is None:
        return None
    peak = env.base_rps + max(env.rises_rps)
    if rate_rps > peak:
        return None
    hold_usd = config.hot_idle_usd_per_hour * bucket_of(config) / 3600.0
    cap = config.replica_capacity_rps

    # The top alone, as a rectangle: a burst's misses land in the buckets after its top (its
    # backlog drains there), so the top bucket's own curve under-prices it where buckets are
    # short; the rectangle is the bound the trend is capped at, not a hold.
    def cost(n: int) -> float:
        return n * hold_usd + config.slo_miss_usd * peak_misses(
            peak, n * cap, config.burst_length_s, config.ttft_p95_target_s)

    replicas = min(range(config.max_replicas + 1), key=lambda n: (cost(n), n))
    if (floor is not None and env.backlog_priced and floor.misses_per_bucket < NO_MISSES
            and floor.replicas < replicas):
        return KnownPeak(min(peak, floor.replicas * cap), floor.replicas, by_curves=True)
    return KnownPeak(peak, replicas)


def bucket_of(config: AutoscaleConfig) -> float:
    """One cold start, but at least one look-back: the rate is a look-back mean, so a shorter
    bucket (and the one before it) would see only part of a rise."""
    return max(config.burst_bucket_s or config.startup_cold_s, config.look_back_s)
