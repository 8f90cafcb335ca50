"""One autoscaling config, built in one place: a model's config-file section -> AutoscaleConfig.

Every entry point that runs a policy hands `decide` what this returns for the same model: the
live Ray Serve adapter (deployments/apps/autoscaling_options.py `live_policy`), `hbmserve simulate --policy`, `hbmserve
autoscale evaluate` and the baselines derived from it (registry.py), and `hbmserve plan`'s
suggested autoscaling section (tests/unit/autoscale/test_autoscale_config.py proves they agree).

The defaults of every field a user can set live in the schema (core/autoscaling_spec.py
`AutoscalingSpec`, core/config.py `SLO`); AutoscaleConfig's own defaults cover only the policy's
inner knobs (trend windows, fractions), which the config file does not expose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from hbmserve.core.autoscaling_spec import PriorSpec
from hbmserve.core.config import ModelSpec
from hbmserve.core.scaling import Tier


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
    # The burst envelope (envelope.py): how far the rate rose within each start-up-long bucket
    # (`burst_bucket_s`, None: startup_cold_s) over this much of the past; the fleet holds the
    # replicas worth it at the pool's prices (hot_idle_usd_per_hour against slo_miss_usd).
    # 0 turns it off.
    burst_memory_s: float = 1800.0
    burst_bucket_s: float | None = None
    # How long a peak is taken to last, its backlog's drain included: real bursts last 1-3
    # minutes. 60 s left misses after every burst the envelope had seen on the Azure code trace.
    burst_length_s: float = 90.0
    # The envelope's rises to start from, learnt from the service's past (core PriorSpec,
    # autoscale/memory/prior.py); empty: no memory at start.
    prior_rises_rps: tuple[float, ...] = ()
    prior_lengths_s: tuple[float, ...] = ()  # how long the past's bursts lasted
    # What each of those buckets missed per headroom (autoscale/memory/backlog.py), on a grid of
    # prior_miss_step_rps; empty: the prior has only rises.
    prior_misses: tuple[tuple[float, ...], ...] = ()
    prior_miss_step_rps: float = 0.0
    prior_base_rps: float | None = None  # where the past's bursts rose from; None: unknown
    prior_source: str = ""

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
        if self.burst_bucket_s is not None and not self.burst_bucket_s > 0:
            problems.append(f"burst_bucket_s must be > 0 or None, got {self.burst_bucket_s}")
        if self.tpot_p95_target_s is not None and not self.tpot_p95_target_s > 0:
            problems.append(f"tpot_p95_target_s must be > 0 or None, got {self.tpot_p95_target_s}")
        for name in ("ttft_p95_target_s", "target_queue_per_replica", "replica_capacity_rps",
                     "look_back_s", "rate_smoothing_s", "rate_variance_window_s",
                     "slope_noise_window_s", "backlog_drain_s", "burst_length_s"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0")
        for name in ("upscale_delay_s", "rate_upscale_delay_s", "downscale_delay_s",
                     "downscale_cooldown_s", "hot_standby_min", "warm_pool_min", "slo_miss_usd",
                     "hot_idle_usd_per_hour", "warm_idle_usd_per_hour", "burst_memory_s"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if any(not r >= 0 for r in self.prior_rises_rps):
            problems.append("prior_rises_rps must all be >= 0")
        if any(not s > 0 for s in self.prior_lengths_s):
            problems.append("prior_lengths_s must all be > 0")
        if self.prior_misses and (len(self.prior_misses) != len(self.prior_rises_rps)
                                  or not self.prior_miss_step_rps > 0):
            problems.append("prior_misses needs one curve per prior rise and prior_miss_step_rps > 0")
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
        for name in ("prior_rises_rps", "prior_lengths_s"):  # lists once through JSON (Serve's policy_kwargs)
            if name in values:
                values = {**values, name: tuple(values[name])}
        if "prior_misses" in values:
            values = {**values, "prior_misses": tuple(tuple(c) for c in values["prior_misses"])}
        return cls(**values)



def autoscale_config_for(model: ModelSpec, estimated_capacity_rps: float | None = None,
                         tpot_floor_s: float | None = None,
                         estimated_startup_s: Mapping[Tier, float] | None = None) -> AutoscaleConfig | None:
    """None when the model has a fixed replica count.

    `estimated_capacity_rps`: requests/s one replica sustains at the SLO, as a driver estimated
    it from the traffic it replays (the capacity model at the trace's lengths). It is used only
    when the config file does not state `replica_capacity_rps`, which always wins.
    `tpot_floor_s`: the lowest TPOT a replica reaches with the model's engine settings, from the
    capacity model (capacity/perf/scenario.py `tpot_floor_s`; this brain may not import it, so every
    driver passes it in); None: unknown, every TPOT miss is taken as one replicas can fix.
    `estimated_startup_s`: seconds to serving per tier from the start-up model, fed by what was
    measured (capacity/perf/startup_measured.py `startup_estimate`; passed in for the same reason).
    Used only when the config file does not state `startup_s`, which always wins; None: the
    schema's defaults.
    """
    a = model.autoscaling
    if a is None:
        return None
    if isinstance(a.prior, str):  # core/config.py load_cluster_spec reads the file; data alone has only its name
        raise ValueError(f"models.{model.name}.autoscaling.prior: {a.prior!r} is a file path; load the config "
                         f"file (hbmserve.core.config.load_cluster_spec) to read it")
    stated = "replica_capacity_rps" in a.model_fields_set
    capacity = a.replica_capacity_rps if stated or estimated_capacity_rps is None \
        else estimated_capacity_rps
    startup = {t: getattr(a.startup_s, t.value) for t in Tier}
    if "startup_s" not in a.model_fields_set and estimated_startup_s is not None:
        startup = {t: float(estimated_startup_s[t]) for t in Tier}
    return AutoscaleConfig(
        min_replicas=a.min_replicas, max_replicas=a.max_replicas,
        ttft_p95_target_s=model.slo.ttft_p95_ms / 1000.0,
        tpot_p95_target_s=model.slo.tpot_p95_ms / 1000.0,
        target_queue_per_replica=a.target_queue_per_replica,
        replica_capacity_rps=capacity,
        startup_hot_s=startup[Tier.HOT], startup_warm_s=startup[Tier.WARM],
        startup_cold_s=startup[Tier.COLD],
        hot_standby_min=a.hot_standby.min, hot_standby_max=a.hot_standby.max,
        warm_pool_min=a.warm_pool.min, warm_pool_max=a.warm_pool.max,
        upscale_delay_s=a.upscale_delay_s, downscale_delay_s=a.downscale_delay_s,
        downscale_cooldown_s=a.downscale_cooldown_s,
        tpot_floor_s=tpot_floor_s,
        burst_memory_s=a.burst.memory_s, burst_length_s=a.burst.length_s,
        slo_miss_usd=a.slo_miss_usd,
        # A prior to read from Prometheus is learnt where the app is built (deployments/apps).
        prior_rises_rps=a.prior.rises_rps if isinstance(a.prior, PriorSpec) else (),
        prior_lengths_s=a.prior.lengths_s if isinstance(a.prior, PriorSpec) else (),
        prior_misses=a.prior.misses if isinstance(a.prior, PriorSpec) else (),
        prior_miss_step_rps=a.prior.miss_step_rps if isinstance(a.prior, PriorSpec) else 0.0,
        prior_base_rps=a.prior.base_rps if isinstance(a.prior, PriorSpec) else None,
        prior_source=a.prior.learned_from if isinstance(a.prior, PriorSpec) else "",
    )
