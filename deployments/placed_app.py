"""The planned variant of a model's Serve application: one Serve deployment per planned replica.

Used when the config names a cluster `topology` and the model needs GPUs
(`ClusterSpec.plans_placement`). The placement planner decides every replica's nodes, NVLink
islands and GPUs; each replica then becomes its own deployment, `engine-<model>-r<i>` with
`num_replicas=1`, whose placement group comes from the Ray adapter (one GPU per bundle, pinned to
the planned island) and whose `VLLM_RAY_BUNDLE_INDICES` pins vLLM's rank order. Each announces its endpoint like any replica, so the front door routes to
them and the endpoint is the same as without planning.

A started replica checks where its bundles landed (placement/ray_observe.py), compares that
with its plan (placement/verification.py), logs a warning with the extra all-reduce cost when a
TP group crossed an island or node, and reports a `PlacementReport` in `info()`.

An autoscaled model is planned at its ceiling, `autoscaling.max_replicas` replicas: each planned
replica is a slot deployment that runs 0 or 1 replica as the model's one policy decides
(slot_autoscaling.py says why this design), so a replica the autoscaler adds is placed and
verified like a fixed one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from hbmserve.core.cache_spec import WeightCacheSpec
from hbmserve.core.config import ClusterSpec, ModelSpec
from hbmserve.core.engine_settings import EngineKind
from hbmserve.core.records import PlacementReport, ReplicaInfo
from hbmserve.core.scaling import ReplicaState
from hbmserve.deployments.serve_app import EngineReplica, actor_options, engine_deployment_name
from hbmserve.placement.plan_types import PlacementPlan, PlacementRequest
from hbmserve.placement.planner import plan
from hbmserve.placement.ray_adapter import PlacementGroupSpec, placement_group_specs
from hbmserve.placement.topology import ClusterTopology, GpuRef
from hbmserve.placement.verification import RankReport, VerificationResult, verify_replica

log = logging.getLogger("hbmserve.replica")


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


def deployment_name(model: ModelSpec, replica: int) -> str:
    return f"engine-{model.name}-r{replica}".replace("/", "-").replace(":", "-")


def _actor_holds_gpu(model: ModelSpec) -> bool:
    # A one-GPU vLLM engine runs inside the replica process, which must hold the GPU itself;
    # every other engine's ranks (or the simulator's reservation) live in the group's bundles.
    return model.engine is EngineKind.VLLM_GPU and model.parallelism.tp * model.parallelism.pp == 1


def replica_actor_options(model: ModelSpec, pg: PlacementGroupSpec) -> dict:
    """The replica actor's resources (they must fit bundle 0, where Serve puts the actor) and the
    rank -> bundle order for vLLM's Ray executor."""
    options = {"num_cpus": actor_options(model).get("num_cpus", 0), "num_gpus": 1 if _actor_holds_gpu(model) else 0}
    env = pg.vllm_env()
    if env:
        options["runtime_env"] = {"env_vars": env}
    return options


def placed_specs(model: ModelSpec, result: PlacementPlan, topology: ClusterTopology) -> tuple[PlacementGroupSpec, ...]:
    replica_cpus = float(actor_options(model).get("num_cpus", 0))
    return placement_group_specs(result, topology, name_prefix=f"engine-{model.name}", replica_cpus=replica_cpus)


def deployment_options(model: ModelSpec, pg: PlacementGroupSpec, autoscaling: dict | None = None) -> dict:
    """Keyword arguments for `serve.deployment` of one planned replica (pure). `autoscaling`:
    the slot's AutoscalingConfig kwargs (slot_autoscaling.py) for an autoscaled model."""
    from hbmserve.deployments.replica_http import DRAIN_TIMEOUT_S

    return {
        "name": deployment_name(model, pg.replica),
        **({"num_replicas": 1} if autoscaling is None else {"autoscaling_config": autoscaling}),
        "ray_actor_options": replica_actor_options(model, pg),
        "health_check_period_s": 10,
        "health_check_timeout_s": 30,
        "graceful_shutdown_timeout_s": DRAIN_TIMEOUT_S + 10,
        **pg.serve_options(),
    }


def placement_report(verification: VerificationResult, reports: Sequence[RankReport]) -> PlacementReport:
    """What a planned replica reports in `info()`: the verification's status form (checked once,
    here, at start) plus where each rank was observed."""
    observed = [{"rank": r.rank, "node": r.node, "gpu": r.gpu_index if r.gpu_index is not None else r.gpu_uuid}
                for r in reports]
    return PlacementReport.from_dict(verification.to_status_dict() | {"observed": observed},
                                     source="placement verification")


class PlacedEngineReplica(EngineReplica):
    """An EngineReplica that knows its planned placement and verifies it on start.

    `peers` are the model's other planned replicas: Serve only includes a deployment in an
    application when the ingress binds it, so replica 0 binds the rest; it never calls them.
    """

    async def __init__(self, model_json: str, host: str, internal_token: str, cache_json: str,
                     result: PlacementPlan, topology: ClusterTopology, pg: PlacementGroupSpec, *peers) -> None:
        from hbmserve.placement.ray_observe import observe_ranks

        model = ModelSpec.model_validate_json(model_json)
        # Before the engine starts: the probes borrow each bundle's GPU for a moment.
        reports = await observe_ranks(pg, actor_holds_bundle_0_gpu=_actor_holds_gpu(model))
        self.verification = verify_replica(result, pg.replica, reports, topology)
        self.placement = placement_report(self.verification, reports)
        self._record_metrics(deployment_name(model, pg.replica))
        await super().__init__(model_json, host, internal_token, cache_json)

    def _record_metrics(self, deployment: str) -> None:
        from hbmserve.placement.ray_observe import log_verification, publish_verification_metrics

        publish_verification_metrics(deployment, self.verification)
        log_verification(self.verification, log, deployment)

    def _placement(self) -> PlacementReport:
        return self.placement

    def _replica_info(self, role: ReplicaState) -> ReplicaInfo:
        return dataclasses.replace(super()._replica_info(role), placement=self.placement)

    def _decision_deployment(self) -> str:
        # One decision for every slot: published under the model's engine deployment name.
        return engine_deployment_name(self.model)


def build_placed_app(host: str, internal_token: str, model: ModelSpec,
                     result: PlacementPlan, topology: ClusterTopology, cache: WeightCacheSpec):
    """The model's one Serve application: a deployment per planned replica, replica 0 as ingress."""
    from ray import serve

    from hbmserve.deployments.slot_autoscaling import slot_autoscaling_configs

    specs = placed_specs(model, result, topology)
    scaling: list[dict | None] = [None] * len(specs)
    if model.autoscaling is not None:
        scaling = list(slot_autoscaling_configs(model, len(specs), engine_deployment_name(model)))
    bound = []
    for pg, autoscaling in zip(specs, scaling):
        deployment = serve.deployment(PlacedEngineReplica, **deployment_options(model, pg, autoscaling))
        bound.append((deployment, (model.model_dump_json(), host, internal_token, cache.model_dump_json(),
                                   result, topology, pg)))
    (first, first_args), rest = bound[0], bound[1:]
    return first.bind(*first_args, *(d.bind(*args) for d, args in rest))
