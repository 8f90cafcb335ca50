"""One autoscaling config, built in one place: a model's config-file section -> AutoscaleConfig.

Every entry point that runs a policy hands `decide` what this returns for the same model: the
live Ray Serve adapter (apps/model_app.py), `hbmserve simulate --policy`, `hbmserve
autoscale evaluate` and the baselines derived from it (registry.py), and `hbmserve plan`'s
suggested autoscaling section (tests/unit/test_autoscale_config.py proves they agree).

The defaults of every field a user can set live in the schema (core/config.py
`AutoscalingSpec`, `SLO`); AutoscaleConfig's own defaults cover only the policy's inner knobs
(trend windows, fractions), which the config file does not expose.
"""

from __future__ import annotations

from collections.abc import Mapping

from hbmserve.autoscale.policy import AutoscaleConfig
from hbmserve.core.config import ModelSpec
from hbmserve.core.scaling import Tier


def autoscale_config_for(model: ModelSpec, estimated_capacity_rps: float | None = None,
                         tpot_floor_s: float | None = None,
                         estimated_startup_s: Mapping[Tier, float] | None = None) -> AutoscaleConfig | None:
    """None when the model has a fixed replica count.

    `estimated_capacity_rps`: requests/s one replica sustains at the SLO, as a driver estimated
    it from the traffic it replays (the capacity model at the trace's lengths). It is used only
    when the config file does not state `replica_capacity_rps`, which always wins.
    `tpot_floor_s`: the lowest TPOT a replica reaches with the model's engine settings, from the
    capacity model (capacity/scenario.py `tpot_floor_s`; this brain may not import it, so every
    driver passes it in); None: unknown, every TPOT miss is taken as one replicas can fix.
    `estimated_startup_s`: seconds to serving per tier from the start-up model, fed by what was
    measured (capacity/startup_measured.py `startup_estimate`; passed in for the same reason).
    Used only when the config file does not state `startup_s`, which always wins; None: the
    schema's defaults.
    """
    a = model.autoscaling
    if a is None:
        return None
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
    )
