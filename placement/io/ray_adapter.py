"""Ray adapter: a PlacementPlan -> one placement group per replica.

Each GPU gets its own bundle (vLLM refuses bundles with more than one GPU). A bundle asks for
`{"GPU": 1, "nvlink_island:<node>-<k>": 1}`: the island resource exists only on that node (see
bootstrap.py), so it pins the bundle to the node and counts the island's GPUs; a
`bundle_label_selector` on `hbmserve.io/node` says the same thing in labels. Bundles are listed
in rank order (stage-major, TP rank minor) and `VLLM_RAY_BUNDLE_INDICES` pins vLLM's
rank -> bundle order to it.

Caveats that the verification step exists for:
- Ray accounts GPUs per node, not per island: the resource guarantees the island's *count*, and
  which physical GPU IDs a bundle receives is Ray's choice (lowest free IDs in practice). On a
  fresh node the planner's lowest-index-first choice matches; after churn it may not, and
  `verification.verify_replica` reports it.
- vLLM still re-sorts workers by (driver node, workers per node, IP) after creating them, so a
  multi-node replica's PP stage order can differ from the plan's; TP groups stay intact because
  every group's ranks are contiguous on their node(s).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hbmserve.placement.bootstrap import NODE_LABEL, island_index_of, island_resource, label_value
from hbmserve.placement.placement_types import PlacementPlan
from hbmserve.placement.topology import ClusterTopology

VLLM_BUNDLE_INDICES_ENV = "VLLM_RAY_BUNDLE_INDICES"


@dataclass(frozen=True)
class BundleSpec:
    index: int  # position in the placement group
    rank: int  # the worker rank this bundle hosts (stage * tp + tp_rank)
    node: str
    gpu: int  # the GPU the plan intends; Ray picks the physical ID (see module docstring)
    resources: Mapping[str, float]
    label_selector: Mapping[str, str]


@dataclass(frozen=True)
class PlacementGroupSpec:
    replica: int
    name: str
    strategy: str
    bundles: tuple[BundleSpec, ...]
    bundle_indices: str | None  # VLLM_RAY_BUNDLE_INDICES; None when a rank spans several GPUs

    def bundle_dicts(self) -> list[dict[str, float]]:
        return [dict(b.resources) for b in self.bundles]

    def bundle_label_selector(self) -> list[dict[str, str]]:
        return [dict(b.label_selector) for b in self.bundles]

    def bundle_for_rank(self, rank: int) -> int:
        for bundle in self.bundles:
            if bundle.rank == rank:
                return bundle.index
        raise KeyError(f"placement group {self.name} has no rank {rank}")

    def vllm_env(self) -> dict[str, str]:
        return {} if self.bundle_indices is None else {VLLM_BUNDLE_INDICES_ENV: self.bundle_indices}

    def serve_options(self) -> dict[str, Any]:
        """Keyword arguments for a Ray Serve deployment's `.options(...)`."""
        return {
            "placement_group_bundles": self.bundle_dicts(),
            "placement_group_strategy": self.strategy,
            "placement_group_bundle_label_selector": self.bundle_label_selector(),
        }


def placement_group_specs(
    plan: PlacementPlan,
    topology: ClusterTopology,
    name_prefix: str = "hbmserve",
    cpus_per_bundle: float = 0.0,
    replica_cpus: float = 0.0,
) -> tuple[PlacementGroupSpec, ...]:
    """Placement groups for every replica of a feasible plan.

    `replica_cpus` is added to bundle 0, where Ray Serve schedules the replica actor itself.
    """
    if not plan.feasible:
        raise ValueError(f"cannot build placement groups for an infeasible plan: {plan.reason}")
    per_rank = plan.request.gpus_per_rank
    specs = []
    for replica in plan.replicas:
        bundles = []
        for stage in replica.stages:
            for pos, ref in enumerate(stage.members):
                k = island_index_of(topology.node(ref.node), ref.gpu)
                resources: dict[str, float] = {"GPU": 1.0, island_resource(ref.node, k): 1.0}
                cpus = cpus_per_bundle + (replica_cpus if not bundles else 0.0)
                if cpus > 0:
                    resources["CPU"] = cpus
                rank = stage.stage * plan.request.tp + pos // per_rank
                bundles.append(BundleSpec(
                    index=len(bundles),
                    rank=rank,
                    node=ref.node,
                    gpu=ref.gpu,
                    resources=resources,
                    label_selector={NODE_LABEL: label_value(ref.node)},
                ))
        nodes = {b.node for b in bundles}
        order = ",".join(str(b.index) for b in sorted(bundles, key=lambda b: b.rank))
        specs.append(PlacementGroupSpec(
            replica=replica.index,
            name=f"{name_prefix}-r{replica.index}",
            strategy="STRICT_PACK" if len(nodes) == 1 else "PACK",
            bundles=tuple(bundles),
            bundle_indices=order if per_rank == 1 else None,
        ))
    return tuple(specs)


def create_placement_group(spec: PlacementGroupSpec, lifetime: str | None = None) -> Any:
    """Ask Ray for the group (asynchronous: wait on `.ready()`); needs `ray.init` first."""
    from ray.util.placement_group import placement_group

    return placement_group(
        bundles=spec.bundle_dicts(),
        strategy=spec.strategy,
        name=spec.name,
        lifetime=lifetime,
        bundle_label_selector=spec.bundle_label_selector(),
    )


def rank_scheduling_strategy(pg: Any, spec: PlacementGroupSpec, rank: int) -> Any:
    """Scheduling strategy that puts the actor for `rank` in its planned bundle."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(
        placement_group=pg,
        placement_group_bundle_index=spec.bundle_for_rank(rank),
        placement_group_capture_child_tasks=True,
    )
