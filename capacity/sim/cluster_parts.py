"""The cluster simulator's parts (cluster_sim.py): what a run is given (the cluster, the policy
binding) and one simulated replica's state."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hbmserve.core.config import SloSeconds
from hbmserve.core.scaling import ReplicaState, ScaleDecision, Snapshot, Tier
from hbmserve.capacity.perf.engine_core import EngineConfig, EngineCore, Plan
from hbmserve.capacity.perf.perf_model import Deployment
from hbmserve.capacity.perf.scenario import Scenario

Policy = Callable[[Snapshot, Any], tuple[ScaleDecision, Any]]

DEFAULT_STARTUP_S: Mapping[Tier, float] = {Tier.HOT: 5.0, Tier.WARM: 60.0, Tier.COLD: 600.0}


@dataclass(frozen=True)
class PolicyBinding:
    policy: Policy
    initial_state: Any = None
    interval_s: float = 10.0
    lookback_s: float = 30.0
    startup_s: Mapping[Tier, float] = field(default_factory=lambda: dict(DEFAULT_STARTUP_S))
    initial_standby: Mapping[Tier, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SimCluster:
    deployment: Deployment
    engine: EngineConfig
    replicas: int
    slo: SloSeconds = SloSeconds()
    usd_per_gpu_hour: float | None = None  # None: the deployment GPU's catalog price


def cluster_for(sc: Scenario, replicas: int | None = None) -> SimCluster:
    """The simulated cluster a config entry stands for (capacity/perf/scenario.py): its deployment,
    engine, SLO and price; `replicas` at start (default: the entry's)."""
    return SimCluster(sc.deployment, sc.engine, sc.replicas if replicas is None else replicas,
                      SloSeconds(sc.slo_ttft_s, sc.slo_tpot_s), sc.usd_per_gpu_hour)


class _Replica:
    __slots__ = ("rid", "seq", "state", "tier", "engine", "created", "ready_at", "removed", "plan",
                 "plan_start", "epoch", "ready_epoch", "served", "ordered")

    def __init__(self, seq: int, state: ReplicaState, engine: EngineCore, now: float, ready_at: float,
                 tier: Tier | None = None) -> None:
        self.rid, self.seq = f"r{seq}", seq  # seq: creation order, larger is newer
        self.state, self.engine, self.tier = state, engine, tier
        self.created, self.ready_at = now, ready_at
        self.removed: float | None = None
        self.plan: Plan | None = None
        self.plan_start = 0.0
        # Events carry the epoch they were pushed at; a newer one voids them. Steps and
        # readiness count apart: a demoted replica still finishing its work may be promoted
        # back, and neither its step in flight nor its new start-up may void the other.
        self.epoch = 0
        self.ready_epoch = 0
        self.served = state is ReplicaState.ACTIVE  # has been routed to
        self.ordered = True  # started by the policy, not part of the fleet at t=0


