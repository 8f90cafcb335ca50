"""Serve autoscaling options for a model: the live policy's inputs and the AutoscalingConfig
kwargs that run it, for an unplaced model (one deployment), a planned one (one slot deployment
per planned replica) and a disaggregated one whose pools both autoscale (one deployment per pool,
one decision). Part of the one options builder (options.py).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from hbmserve.autoscale.memory.prior import PriorError, arrivals_of_rates, learn_prior, learnt_config
from hbmserve.autoscale.policy_config import autoscale_config_for
from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.pools.pools_policy import PoolsConfig, pool_config
from hbmserve.autoscale.slots import slot_min_replicas
from hbmserve.capacity.perf.hardware import load_catalog
from hbmserve.capacity.perf.length_capacity import CapacityTable, capacity_table
from hbmserve.capacity.perf.perf_model import cost_model
from hbmserve.capacity.perf.plan_analytic import prefill_capacity_rps
from hbmserve.capacity.perf.scenario import (NOMINAL_PROMPT_TOKENS, knobs_of, nominal_workload, scenario_for,
                                             tpot_floor_s)
from hbmserve.capacity.perf.startup_measured import startup_estimate, startup_inputs_for
from hbmserve.deployments.control.autoscaling import POLICY_PATH, REPLICA_STATS_PUSH_S
from hbmserve.deployments.control.pool_autoscaling import POOLS_POLICY_PATH
from hbmserve.deployments.control.prometheus_history import HistoryError, request_rates
from hbmserve.deployments.control.slot_autoscaling import SLOT_POLICY_PATH
from hbmserve.deployments.wire.names import engine_deployment_name
from hbmserve.core.autoscaling_spec import PrometheusPriorSpec
from hbmserve.core.config import ModelSpec
from hbmserve.core.disagg_spec import Role
from hbmserve.core.engine_settings import EngineKind
from hbmserve.core.scaling import Tier

# A prefill replica's prompt tokens per second where the capacity model does not know the pool's
# GPU or shape: below what it gives one 8B model on an L4 or a 70B one on four H100s (about 14k
# at 2,048-token prompts), so that an unknown pool is grown for its backlog early rather than late.
DEFAULT_PREFILL_TOKENS_PER_S = 10_000.0

log = logging.getLogger(__name__)


def live_startup(model: ModelSpec) -> dict[Tier, float] | None:
    """The start-up model's seconds per tier for `model` (capacity/perf/startup_measured.py), for a
    config that states none; None when the capacity model does not know its GPU or shape: the
    schema's defaults then stand."""
    try:
        return startup_estimate(model, scenario_for(model, load_catalog()).deployment.gpu)
    except (ValueError, OSError):  # as live_capacity: the model unknown to the catalog
        return None


def live_promote_s(model: ModelSpec) -> float | None:
    """The start-up model's promotion for a model whose standbys sleep, added to the wakes its
    replicas measure (`with_measured_startup`); None for any other model, or when the start-up
    model has nothing for it (the configured hot start-up then stands)."""
    if not model.standbys_sleep:
        return None
    try:
        return startup_inputs_for(model, scenario_for(model, load_catalog()).deployment.gpu).promote_s
    except (ValueError, OSError):  # as live_startup
        return None


def live_capacity(model: ModelSpec) -> tuple[CapacityTable | None, float | None]:
    """The capacity model's replica capacity by request length and TPOT floor for `model`, built
    where the config is (its files are here, not in Serve's controller); (None, None) when the
    capacity model does not know its GPU or shape: the policy then runs on the configured figure."""
    try:
        sc = scenario_for(model, load_catalog())
    except (ValueError, OSError):  # ScenarioError, CatalogError, ModelConfigError: all ValueErrors
        return None, None
    table = capacity_table(cost_model(sc.deployment), knobs_of(sc), sc.slo_ttft_s, sc.slo_tpot_s)
    return table, tpot_floor_s(sc)


def policy_kwargs(config: AutoscaleConfig, capacity: CapacityTable | None = None,
                  promote_s: float | None = None) -> dict[str, Any]:
    """What Serve hands `HbmServeAutoscalingPolicy(**kwargs)`: the config's fields, the capacity
    table when the replica capacity is re-estimated, and the promotion of sleeping standbys."""
    return {**asdict(config), **({"capacity_by_length": capacity.to_dict()} if capacity else {}),
            **({"promote_s": promote_s} if promote_s is not None else {})}


def serve_autoscaling_config(config: AutoscaleConfig, capacity: CapacityTable | None = None,
                             promote_s: float | None = None) -> dict[str, Any]:
    """Kwargs for ray.serve.config.AutoscalingConfig running hbmserve's policy. Serve wraps every
    custom policy in its own delay logic (autoscaling_policy.py _apply_autoscaling_config), so
    its delays are 0 here and the policy's hysteresis is the only one. `promote_s`: for a model
    whose standbys sleep (`live_promote_s`)."""
    return {
        "min_replicas": config.min_replicas,
        # Standbys only fill room under max_replicas (warm_pool.size_pool), so active + hot
        # never exceeds it.
        "max_replicas": config.max_replicas,
        "look_back_period_s": config.look_back_s,
        "metrics_interval_s": min(REPLICA_STATS_PUSH_S, config.look_back_s / 2),
        "upscale_delay_s": 0.0,
        "downscale_delay_s": 0.0,
        "downscale_to_zero_delay_s": 0.0,
        "policy": {"policy_function": POLICY_PATH, "policy_kwargs": policy_kwargs(config, capacity, promote_s)},
    }


@dataclass(frozen=True)
class LivePolicy:
    """A model's live policy inputs, resolved where the config and the capacity model's files are
    (not in Serve's controller): the one AutoscaleConfig every path deploys."""

    config: AutoscaleConfig
    capacity: CapacityTable | None  # set when `autoscaling.reestimate_capacity`
    promote_s: float | None  # set for a model whose standbys sleep

    def serve_config(self) -> dict[str, Any]:
        return serve_autoscaling_config(self.config, self.capacity, self.promote_s)


def live_prior(model: ModelSpec, config: AutoscaleConfig, now: float) -> AutoscaleConfig:
    """`config` starting from the prior its Prometheus history teaches, for a model whose
    `autoscaling.prior` names a Prometheus server; as it is for any other. A history that cannot
    teach one (unreachable, empty, shorter than a bucket) is no reason to refuse the deploy: the
    policy starts without memory and its prior source says why, as status and the log show."""
    spec = model.autoscaling.prior if model.autoscaling is not None else None
    if not isinstance(spec, PrometheusPriorSpec):
        return config
    try:
        history = request_rates(spec.prometheus, model.name, spec.window_s, spec.step_s, now, spec.timeout_s)
        prior = learn_prior(arrivals_of_rates(history.rates, history.step_s), config,
                            source=f"Prometheus {spec.prometheus}, the last {spec.window_s:g} s", interval_s=1.0)
    except (HistoryError, PriorError) as err:
        log.warning("models.%s.autoscaling.prior: starting without a prior: %s", model.name, err)
        return dataclasses.replace(config, prior_source=f"none: {err}")
    return learnt_config(config, prior)


def live_policy(model: ModelSpec) -> LivePolicy | None:
    """The policy inputs of an autoscaled model, None for a fixed one. The unplaced and the
    slotted paths both come through here, so they plan with the same start-up and capacity."""
    if model.autoscaling is None:
        return None
    table, floor = live_capacity(model)
    config = autoscale_config_for(model, tpot_floor_s=floor, estimated_startup_s=live_startup(model))
    if config is None:
        raise ValueError(f"models.{model.name}.autoscaling: no policy config could be built")
    config = live_prior(model, config, time.time())
    return LivePolicy(config, table if model.autoscaling.reestimate_capacity else None, live_promote_s(model))


def slot_autoscaling_configs(model: ModelSpec, slots: int, model_deployment: str) -> list[dict[str, Any]]:
    """Serve AutoscalingConfig kwargs for each slot deployment of a planned, autoscaled `model`:
    the model's own config (`live_policy`) with a 0..1 range per slot; slot 0 leads and runs the
    model's policy (deployments/control/slot_autoscaling.py says why)."""
    policy = live_policy(model)
    if policy is None:
        raise ValueError(f"models.{model.name}: only an autoscaled model has slots")
    base, config = policy.serve_config(), policy.config
    leader = policy_kwargs(config, policy.capacity, policy.promote_s)
    return [{**base, "min_replicas": slot_min_replicas(config.min_replicas, k), "max_replicas": 1,
             "policy": {"policy_function": SLOT_POLICY_PATH,
                        "policy_kwargs": {"slot": k, "slots": slots, "model_deployment": model_deployment,
                                          "look_back_s": config.look_back_s,
                                          "leader": leader if k == 0 else None}}}
            for k in range(slots)]


def live_prefill_rate(pool: ModelSpec) -> tuple[float, float, float | None]:
    """(prompt tokens/s one replica of the prefill `pool` computes, the prompt mean it is figured
    at, the requests/s it serves within the TTFT target): the capacity model's
    `prefill_tokens_per_s` under the pool's engine token budget and `prefill_capacity_rps` (the
    simulator's figures, capacity/sim/pools/pools_eval.py), at the nominal prompt the capacity
    checks judge (capacity/perf/scenario.py `nominal_workload`: no config states a prompt mean); a
    simulated engine runs `sim.speedup` times both. Where the capacity model does not know the GPU
    or shape: DEFAULT_PREFILL_TOKENS_PER_S at the nominal prompt, and no capacity (the configured
    one stands)."""
    try:
        sc = scenario_for(pool, load_catalog())
    except (ValueError, OSError):  # as live_capacity
        return DEFAULT_PREFILL_TOKENS_PER_S, float(NOMINAL_PROMPT_TOKENS), None
    w, cost = nominal_workload(sc), cost_model(sc.deployment)
    speed = pool.sim.speedup if pool.engine is EngineKind.SIM else 1.0
    rate = cost.prefill_tokens_per_s(w.prompt_mean, sc.engine.max_num_batched_tokens)
    rps = prefill_capacity_rps(cost, knobs_of(sc), w, sc.slo_ttft_s)
    return rate * speed, w.prompt_mean, rps * speed if rps > 0 else None


def pools_autoscale(model: ModelSpec) -> bool:
    """Whether `model` is disaggregated with both pools autoscaled: they then share one decision
    (deployments/control/pool_autoscaling.py). With one pool fixed, the other runs the
    per-deployment policy on its own signals: there is no second count to decide with it."""
    return model.disaggregation is not None and all(model.disaggregation.of(r).autoscaling for r in Role)


def pool_autoscaling_config(model: ModelSpec, role: Role) -> dict[str, Any]:
    """Serve AutoscalingConfig kwargs for pool `role` of a disaggregated `model` whose pools both
    autoscale (`pools_autoscale`): the pool's own bounds and Serve settings (`live_policy` of the
    pool), running the two-pool policy. The decode pool's leads and carries the PoolsConfig: each
    pool's config through `pool_config`, and the prefill pool's prompt-token rate
    (`live_prefill_rate`); its prompt mean stands until the replicas report their own."""
    if not pools_autoscale(model):
        raise ValueError(f"models.{model.name}: only a disaggregated model whose pools both autoscale runs "
                         "the two-pool policy")
    policies = {r: live_policy(model.pool(r)) for r in ((role,) if role is Role.PREFILL else Role)}
    own = policies[role]
    kwargs: dict[str, Any] = {"prefill_deployment": engine_deployment_name(model, Role.PREFILL.value),
                              "look_back_s": own.config.look_back_s}
    if role is Role.DECODE:
        prefill = model.pool(Role.PREFILL)
        rate, prompt, rps = live_prefill_rate(prefill)
        pre_config = policies[Role.PREFILL].config
        if rps is not None and "replica_capacity_rps" not in prefill.autoscaling.model_fields_set:
            # An aggregated replica's capacity (what live_policy estimates) counts its decode
            # work too; a prefill replica's is its prompts' within the TTFT target.
            pre_config = dataclasses.replace(pre_config, replica_capacity_rps=rps)
        pools = PoolsConfig(prefill=pool_config(pre_config, decode=False),
                            decode=pool_config(own.config, decode=True), prefill_tokens_per_s=rate)
        kwargs |= {"pools": pools.to_dict(), "prompt_mean_tokens": prompt}
    return {**own.serve_config(), "policy": {"policy_function": POOLS_POLICY_PATH, "policy_kwargs": kwargs}}
