"""Every Serve deployment's options, built in one place.

Four kinds of deployment run in an hbmserve cluster: a model's engine deployment (unplaced), one
deployment per planned replica of a placed model (fixed, or a 0..1 slot of an autoscaled one), the
front door and the warm-tier aggregator. Each gets its `serve.deployment` keyword arguments from a
builder here, as a `DeploymentOptions`; `hbmserve deploy`, `hbmserve serve-config` and the Helm
chart's applications (deployments/apps/declarative.py) all build through these, so a model deploys with the
same health checks, shutdown, names, autoscaling and placement whichever path deployed it
(tests/unit/deployments/apps/test_options.py checks every path against the others).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hbmserve.deployments.apps.autoscaling_options import (live_policy, pool_autoscaling_config, pools_autoscale,
                                                          slot_autoscaling_configs)
from hbmserve.core.config import ModelSpec
from hbmserve.core.disagg_spec import Role
from hbmserve.placement.io.ray_adapter import PlacementGroupSpec
from hbmserve.deployments.replica.replica_http import DRAIN_TIMEOUT_S
from hbmserve.deployments.wire.names import (FRONT_DOOR_DEPLOYMENT, WARM_TIER_DEPLOYMENT, engine_deployment_name,
                                 slot_deployment_name)
from hbmserve.deployments.wire.resources import actor_holds_gpu, actor_options, pinned_bundles

ENGINE_HEALTH_CHECK_PERIOD_S = 10.0
# An engine busy with a long prefill answers its health check late.
ENGINE_HEALTH_CHECK_TIMEOUT_S = 30.0
# Past this Serve kills the replica: the replica's own drain (replica_http.DRAIN_TIMEOUT_S) must
# finish first.
ENGINE_SHUTDOWN_S = DRAIN_TIMEOUT_S + 10
FRONT_DOOR_HEALTH_CHECK_PERIOD_S = 10.0
FRONT_DOOR_SHUTDOWN_S = 15.0
WARM_TIER_HEALTH_CHECK_PERIOD_S = 10.0


@dataclass(frozen=True)
class DeploymentOptions:
    """One Serve deployment's options; `serve_kwargs()` is what `serve.deployment` takes. Unset
    (None) fields are left to Serve's defaults."""

    name: str
    ray_actor_options: dict[str, Any]
    num_replicas: int | None = None
    autoscaling_config: dict[str, Any] | None = None
    max_replicas_per_node: int | None = None
    health_check_period_s: float | None = None
    health_check_timeout_s: float | None = None
    graceful_shutdown_timeout_s: float | None = None
    # The placement group's options for a planned replica (PlacementGroupSpec.serve_options).
    placement: dict[str, Any] = field(default_factory=dict)

    def serve_kwargs(self) -> dict[str, Any]:
        fields = {k: v for k, v in self.__dict__.items() if k != "placement" and v is not None}
        return {**fields, **self.placement}


def _engine(name: str, actor: dict[str, Any], **scaling: Any) -> DeploymentOptions:
    return DeploymentOptions(name=name, ray_actor_options=actor, health_check_period_s=ENGINE_HEALTH_CHECK_PERIOD_S,
                             health_check_timeout_s=ENGINE_HEALTH_CHECK_TIMEOUT_S,
                             graceful_shutdown_timeout_s=ENGINE_SHUTDOWN_S, **scaling)


def model_options(model: ModelSpec, role: str | None = None) -> DeploymentOptions:
    """The engine deployment of an unplaced model: fixed `replicas`, or Serve autoscaling driven
    by hbmserve's policy. `role`: the pool of the disaggregated `model` to deploy
    (`ModelSpec.pool`), under its own name. When both pools autoscale, both run the two-pool
    policy, one decision for the two (deployments/control/pool_autoscaling.py); when only one
    does, it runs the per-deployment policy on its own signals, as an aggregated model's
    deployment would (the fixed pool has no count to decide with it)."""
    pool = model if role is None else model.pool(Role(role))
    if role is not None and pools_autoscale(model):
        scaling: dict[str, Any] = {"autoscaling_config": pool_autoscaling_config(model, Role(role))}
    else:
        policy = live_policy(pool)
        scaling = {"num_replicas": pool.replicas} if policy is None else {"autoscaling_config": policy.serve_config()}
    return _engine(engine_deployment_name(model, role), actor_options(pool), **scaling,
                   max_replicas_per_node=pool.max_replicas_per_node or None, placement=pinned_bundles(pool) or {})


def slot_actor_options(model: ModelSpec, pg: PlacementGroupSpec) -> dict[str, Any]:
    """A planned replica actor's resources (they must fit bundle 0, where Serve puts the actor) and
    the rank -> bundle order for vLLM's Ray executor."""
    options: dict[str, Any] = {"num_cpus": actor_options(model).get("num_cpus", 0),
                               "num_gpus": 1 if actor_holds_gpu(model) else 0}
    env = pg.vllm_env()
    if env:
        options["runtime_env"] = {"env_vars": env}
    return options


def slot_options(model: ModelSpec, specs: tuple[PlacementGroupSpec, ...]) -> list[DeploymentOptions]:
    """One deployment per planned replica of a placed model, in slot order: one replica each for a
    fixed model; for an autoscaled one, a 0..1 slot of the model's one policy (the same policy
    inputs `model_options` gives an unplaced model)."""
    if model.autoscaling is None:
        scaling: list[dict[str, Any]] = [{"num_replicas": 1}] * len(specs)
    else:
        scaling = [{"autoscaling_config": c}
                   for c in slot_autoscaling_configs(model, len(specs), engine_deployment_name(model))]
    return [_engine(slot_deployment_name(model, pg.replica), slot_actor_options(model, pg), **s,
                    placement=pg.serve_options())
            for pg, s in zip(specs, scaling)]


def front_door_options(nodes: int) -> DeploymentOptions:
    """One front door per node (`nodes` of them, at least one)."""
    return DeploymentOptions(name=FRONT_DOOR_DEPLOYMENT, ray_actor_options={"num_cpus": 0}, num_replicas=max(1, nodes),
                             max_replicas_per_node=1, health_check_period_s=FRONT_DOOR_HEALTH_CHECK_PERIOD_S,
                             graceful_shutdown_timeout_s=FRONT_DOOR_SHUTDOWN_S)


def warm_tier_options() -> DeploymentOptions:
    # On the head: a worker node may be removed by the very autoscaler this drives.
    return DeploymentOptions(name=WARM_TIER_DEPLOYMENT, num_replicas=1,
                             ray_actor_options={"num_cpus": 0, "resources": {"node:__internal_head__": 0.001}},
                             health_check_period_s=WARM_TIER_HEALTH_CHECK_PERIOD_S)
