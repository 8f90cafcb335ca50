"""Ray adapter for verification: where did a running replica's placement group really land?

Called from inside a replica (deployments/apps/placed_app.py) before its engine takes the GPUs:
- each bundle's node comes from `ray.util.placement_group_table` (bundle -> node id), mapped to
  the node's `hbmserve.io/node` label through `ray.nodes()`;
- each bundle's GPU comes from a tiny probe task scheduled into that bundle (Ray binds a
  bundle's GPU to a fixed device ID when the group is committed, so the engine's worker for
  that bundle will get the same one); the bundle whose GPU the replica actor itself holds is
  read from the replica's own `get_accelerator_ids()`.
What does not answer in time is reported without a GPU, which verification counts as missing.
The comparison with the plan is the pure `verification.verify_replica`.
"""

from __future__ import annotations

import asyncio
import logging
import os

from hbmserve.placement.bootstrap import NODE_LABEL
from hbmserve.placement.io.ray_adapter import PlacementGroupSpec
from hbmserve.placement.verification import RankReport, VerificationResult


def _gpu_report(rank: int, node: str, ids: list[str] | None, visible: str | None = None) -> RankReport:
    gpu = ids[0] if ids and len(ids) == 1 else None
    if gpu is not None and gpu.isdigit():
        return RankReport(rank, node, gpu_index=int(gpu), cuda_visible_devices=visible)
    return RankReport(rank, node, gpu_uuid=gpu, cuda_visible_devices=visible)


def _node_labels() -> dict[str, str]:
    import ray

    return {n["NodeID"]: (n.get("Labels") or {}).get(NODE_LABEL, "") for n in ray.nodes() if n.get("Alive", True)}


async def observe_ranks(spec: PlacementGroupSpec, actor_holds_bundle_0_gpu: bool,
                        timeout_s: float = 30.0) -> list[RankReport]:
    """One report per rank of `spec`, observed from inside the replica that owns the group."""
    import ray
    from ray.util import get_current_placement_group, placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = get_current_placement_group()
    if pg is None:
        return []  # not running in a placement group at all: every rank reads as missing
    bundle_node = placement_group_table(pg).get("bundles_to_node_id", {})
    label_of = _node_labels()

    @ray.remote(num_cpus=0, num_gpus=1)
    def bundle_gpu_ids() -> list[str]:
        return [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]

    first_bundle = {b.rank: b.index for b in reversed(spec.bundles)}  # a rank's first bundle
    probes = {}
    for rank, index in first_bundle.items():
        if index == 0 and actor_holds_bundle_0_gpu:
            continue
        strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)
        probes[rank] = bundle_gpu_ids.options(scheduling_strategy=strategy).remote()
    gpu_ids: dict[int, list[str] | None] = {}
    if probes:
        try:
            answers = await asyncio.wait_for(asyncio.gather(*probes.values()), timeout=timeout_s)
            gpu_ids = dict(zip(probes, answers))
        except (asyncio.TimeoutError, ray.exceptions.RayError):
            for ref in probes.values():
                ray.cancel(ref, force=True)
    reports = []
    for rank, index in sorted(first_bundle.items()):
        node = label_of.get(bundle_node.get(index, ""), "")
        if index == 0 and actor_holds_bundle_0_gpu:
            own = [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]
            reports.append(_gpu_report(rank, node, own, os.environ.get("CUDA_VISIBLE_DEVICES")))
        else:
            reports.append(_gpu_report(rank, node, gpu_ids.get(rank)))
    return reports


def log_verification(result: VerificationResult, logger: logging.Logger, deployment: str) -> None:
    if result.warning is not None:
        logger.warning("placement of %s: %s", deployment, result.warning)
    else:
        logger.info("placement of %s: %s", deployment, result.reason)


def publish_verification_metrics(deployment: str, result: VerificationResult) -> None:
    """The verification gauges through Ray's metrics agent, which
    Prometheus scrapes on every node; the replica itself has no metrics endpoint of its own."""
    from ray.util.metrics import Gauge

    from hbmserve.placement.verification import Crossing

    tags = {"deployment": deployment, "replica": str(result.replica)}
    keys = tuple(tags)
    Gauge("hbmserve_placement_verified", "1 when every TP group sits where the plan put it",
          tag_keys=keys).set(1.0 if result.placement_verified else 0.0, tags=tags)
    Gauge("hbmserve_placement_crossed_groups", "TP groups that crossed an island or node",
          tag_keys=keys).set(sum(1 for g in result.groups if g.crossing is not Crossing.NONE), tags=tags)
    Gauge("hbmserve_placement_extra_allreduce_microseconds", "Predicted extra time per all-reduce",
          tag_keys=keys).set(result.expected_extra_allreduce_us, tags=tags)
