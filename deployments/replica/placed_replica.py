"""A planned replica: an EngineReplica that knows its planned placement and verifies it on start.

Before its engine starts, the replica checks where its bundles landed
(placement/io/ray_observe.py), compares that with its plan (placement/verification.py), logs a
warning with the extra all-reduce cost when a TP group crossed an island or node, and reports a
`PlacementReport` in `info()`. The deployment itself is built by deployments/apps/placed_app.py.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from hbmserve.core.config import ModelSpec
from hbmserve.core.records import PlacementReport, ReplicaInfo
from hbmserve.core.scaling import ReplicaState
from hbmserve.placement.placement_types import PlacementPlan
from hbmserve.placement.topology import ClusterTopology
from hbmserve.placement.verification import RankReport, VerificationResult, verify_replica
from hbmserve.placement.io.ray_adapter import PlacementGroupSpec
from hbmserve.deployments.replica.engine_replica import EngineReplica
from hbmserve.deployments.wire.names import engine_deployment_name, slot_deployment_name
from hbmserve.deployments.wire.resources import actor_holds_gpu

log = logging.getLogger("hbmserve.deployments.replica")


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
        from hbmserve.placement.io.ray_observe import observe_ranks

        model = ModelSpec.model_validate_json(model_json)
        # Before the engine starts: the probes borrow each bundle's GPU for a moment.
        reports = await observe_ranks(pg, actor_holds_bundle_0_gpu=actor_holds_gpu(model))
        self.verification = verify_replica(result, pg.replica, reports, topology)
        self.placement = placement_report(self.verification, reports)
        self._record_metrics(slot_deployment_name(model, pg.replica))
        await super().__init__(model_json, host, internal_token, cache_json)

    def _record_metrics(self, deployment: str) -> None:
        from hbmserve.placement.io.ray_observe import log_verification, publish_verification_metrics

        publish_verification_metrics(deployment, self.verification)
        log_verification(self.verification, log, deployment)

    def _placement(self) -> PlacementReport:
        return self.placement

    def _replica_info(self, role: ReplicaState) -> ReplicaInfo:
        return dataclasses.replace(super()._replica_info(role), placement=self.placement)

    def _decision_deployment(self) -> str:
        # One decision for every slot: published under the model's engine deployment name.
        return engine_deployment_name(self.model)
