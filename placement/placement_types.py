"""The planner's request and decision types, and their JSON form (the CLI contract)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from hbmserve.placement.link_model import DEFAULT_ALLREDUCE_BYTES
from hbmserve.placement.topology import GpuRef


class InfeasibleReason(enum.Enum):
    NO_GPUS = "no_gpus"
    TP_EXCEEDS_ISLAND = "tp_exceeds_island"
    INSUFFICIENT_CAPACITY = "insufficient_capacity"
    DISTINCT_NODES = "distinct_nodes"


class AlternativeKind(enum.Enum):
    SMALLER_TP_MORE_PP = "smaller_tp_more_pp"
    QUANTIZE = "quantize"
    FEWER_REPLICAS = "fewer_replicas"
    ALLOW_PCIE_TP = "allow_pcie_tp"


@dataclass(frozen=True)
class PlacementRequest:
    """One model deployment: `replicas` copies of a TP x PP engine.

    `gpus_per_rank` GPUs serve each rank (vLLM uses 1). `pp_distinct_nodes` forces every
    pipeline stage of a replica onto its own node (failure isolation, or host memory limits).
    `allow_pcie_tp` lets a TP group use GPUs of one node joined only by PCIe when no NVLink
    island fits - off by default, because that is the mis-placement this planner exists to avoid.
    """

    tp: int
    pp: int = 1
    replicas: int = 1
    gpus_per_rank: int = 1
    pp_distinct_nodes: bool = False
    allow_pcie_tp: bool = False
    allreduce_bytes: int = DEFAULT_ALLREDUCE_BYTES

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "replicas", "gpus_per_rank", "allreduce_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def group_size(self) -> int:
        """GPUs one TP group needs inside a single island."""
        return self.tp * self.gpus_per_rank

    @property
    def gpus_per_replica(self) -> int:
        return self.group_size * self.pp

    def describe(self) -> str:
        per_rank = f" x {self.gpus_per_rank} GPUs/rank" if self.gpus_per_rank > 1 else ""
        return f"{self.replicas} replica(s) of TP={self.tp} x PP={self.pp}{per_rank}"


@dataclass(frozen=True)
class StagePlacement:
    stage: int
    island: str  # planning island id; "<node>-pcie" for a PCIe-only group (allow_pcie_tp)
    members: tuple[GpuRef, ...]  # in TP-rank order; gpus_per_rank consecutive GPUs per rank
    allreduce_us: float
    bottleneck: str | None  # slowest link code in the ring ("NV18", "SYS", "NET"), None for TP=1

    @property
    def node(self) -> str:
        return self.members[0].node

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m.node for m in self.members))

    @property
    def gpus(self) -> tuple[int, ...]:
        """GPU indices on `node`; a stage spanning a multi-node domain lists the rest in members."""
        return tuple(m.gpu for m in self.members if m.node == self.node)

    @property
    def over_nvlink(self) -> bool:
        return not self.island.endswith("-pcie")


@dataclass(frozen=True)
class ReplicaPlacement:
    index: int
    stages: tuple[StagePlacement, ...]
    handoff_us: float  # sum of the stage-to-stage sends for one activation

    @property
    def members(self) -> tuple[GpuRef, ...]:
        return tuple(m for stage in self.stages for m in stage.members)


@dataclass(frozen=True)
class Alternative:
    kind: AlternativeKind
    tp: int
    pp: int
    replicas: int
    note: str


@dataclass(frozen=True)
class PlacementPlan:
    request: PlacementRequest
    feasible: bool
    reason: str
    replicas: tuple[ReplicaPlacement, ...] = ()
    predicted_allreduce_us: float | None = None  # slowest TP group's all-reduce; None if infeasible
    predicted_handoff_us: float | None = None
    infeasible: InfeasibleReason | None = None
    alternatives: tuple[Alternative, ...] = ()

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "feasible": self.feasible,
            "reason": self.reason,
            "replicas": [
                {
                    "stages": [
                        {
                            "node": s.node,
                            "gpus": list(s.gpus),
                            "island": s.island,
                            "members": [{"node": m.node, "gpu": m.gpu} for m in s.members],
                            "allreduce_us": round(s.allreduce_us, 3),
                        }
                        for s in r.stages
                    ],
                    "handoff_us": round(r.handoff_us, 3),
                }
                for r in self.replicas
            ],
            "predicted_allreduce_us": None
            if self.predicted_allreduce_us is None
            else round(self.predicted_allreduce_us, 3),
            "predicted_handoff_us": None
            if self.predicted_handoff_us is None
            else round(self.predicted_handoff_us, 3),
            "infeasible": None if self.infeasible is None else self.infeasible.value,
            "alternatives": [
                {"kind": a.kind.value, "tp": a.tp, "pp": a.pp, "replicas": a.replicas, "note": a.note}
                for a in self.alternatives
            ],
            "request": {
                "tp": self.request.tp,
                "pp": self.request.pp,
                "replicas": self.request.replicas,
                "gpus_per_rank": self.request.gpus_per_rank,
                "pp_distinct_nodes": self.request.pp_distinct_nodes,
                "allow_pcie_tp": self.request.allow_pcie_tp,
                "allreduce_bytes": self.request.allreduce_bytes,
            },
        }
