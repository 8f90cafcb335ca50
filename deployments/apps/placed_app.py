"""The planned variant of a model's Serve application: one Serve deployment per planned replica.

Used when the config names a cluster `topology` and the model needs GPUs
(`ClusterSpec.plans_placement`). The placement planner decides every replica's nodes, NVLink
islands and GPUs; each replica then becomes its own deployment, `engine-<model>-r<i>` with
`num_replicas=1`, whose placement group comes from the Ray adapter (one GPU per bundle, pinned to
the planned island) and whose `VLLM_RAY_BUNDLE_INDICES` pins vLLM's rank order. Each announces its endpoint like any replica, so the front door routes to
them and the endpoint is the same as without planning.

A started replica checks where its bundles landed and reports it (deployments/replica/placed_replica.py).

An autoscaled model is planned at its ceiling, `autoscaling.max_replicas` replicas: each planned
replica is a slot deployment that runs 0 or 1 replica as the model's one policy decides
(deployments/control/slot_autoscaling.py says why this design), so a replica the autoscaler adds is placed and
verified like a fixed one.
"""

from __future__ import annotations

from hbmserve.deployments.apps.options import slot_options
from hbmserve.core.cache_spec import WeightCacheSpec
from hbmserve.core.config import ClusterSpec, ModelSpec
from hbmserve.placement.placement_types import PlacementPlan, PlacementRequest
from hbmserve.placement.placer import plan
from hbmserve.placement.topology import ClusterTopology, GpuRef
from hbmserve.placement.io.ray_adapter import PlacementGroupSpec, placement_group_specs
from hbmserve.deployments.replica.placed_replica import PlacedEngineReplica
from hbmserve.deployments.wire.resources import actor_options


def plan_model(model: ModelSpec, topology: ClusterTopology, in_use: frozenset[GpuRef] = frozenset()) -> PlacementPlan:
    """The planner's answer for the most replicas the model runs (`replica_ceiling`: its fixed
    count, or its autoscaling ceiling) (pure)."""
    p = model.parallelism
    return plan(PlacementRequest(tp=p.tp, pp=p.pp, replicas=model.replica_ceiling), topology, in_use=in_use)


def plan_models(spec: ClusterSpec, topology: ClusterTopology) -> dict[str, PlacementPlan]:
    """Every planned model's plan (models the planner places, with replicas), in config order on
    one topology, each avoiding the GPUs of those before it (pure). An infeasible plan is returned
    as is; the caller reports it. `hbmserve deploy` and the Serve config builders
    (serve_config.py) both plan through here, so they place every replica alike."""
    plans, in_use = {}, frozenset()
    for m in spec.models:
        if spec.plans_placement(m) and m.replica_ceiling > 0:
            plans[m.name] = result = plan_model(m, topology, in_use)
            in_use |= {g for r in result.replicas for g in r.members}
    return plans


def replica_count_field(model: ModelSpec) -> str:
    """The config field the planned replica count comes from."""
    return "replicas" if model.autoscaling is None else "autoscaling.max_replicas"


def infeasible_message(model: ModelSpec, result: PlacementPlan) -> str:
    """The planner's refusal, naming the field that set the replica count."""
    field = replica_count_field(model)
    lines = [f"model {model.name}: no placement for {field}={model.replica_ceiling}: {result.reason}"]
    lines += [f"  alternative: tp={a.tp} pp={a.pp} {field}={a.replicas} ({a.note})" for a in result.alternatives]
    return "\n".join(lines)


def placed_specs(model: ModelSpec, result: PlacementPlan, topology: ClusterTopology) -> tuple[PlacementGroupSpec, ...]:
    replica_cpus = float(actor_options(model).get("num_cpus", 0))
    return placement_group_specs(result, topology, name_prefix=f"engine-{model.name}", replica_cpus=replica_cpus)


def build_placed_app(host: str, internal_token: str, model: ModelSpec,
                     result: PlacementPlan, topology: ClusterTopology, cache: WeightCacheSpec):
    """The model's one Serve application: a deployment per planned replica, replica 0 as ingress."""
    from ray import serve

    specs = placed_specs(model, result, topology)
    bound = []
    for pg, options in zip(specs, slot_options(model, specs)):
        deployment = serve.deployment(PlacedEngineReplica, **options.serve_kwargs())
        bound.append((deployment, (model.model_dump_json(), host, internal_token, cache.model_dump_json(),
                                   result, topology, pg)))
    (first, first_args), rest = bound[0], bound[1:]
    return first.bind(*first_args, *(d.bind(*args) for d, args in rest))
