"""The data a scaling policy sees and returns. Shared by the live adapter and the simulator.

Every policy (hbmserve's own and the baselines) has the same shape:

    decide(snapshot: Snapshot, config, state) -> tuple[ScaleDecision, state]

with no I/O and no wall clock: time arrives as `snapshot.now` (seconds, any epoch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class ReplicaState(str, Enum):
    STARTING = "starting"  # being brought up; counts toward capacity soon, not now
    ACTIVE = "active"  # routed to
    STANDBY = "standby"  # hot: engine loaded but not routed to until promoted
    DRAINING = "draining"  # finishing in-flight requests before removal


class Tier(str, Enum):
    """How far a new replica is from serving; each tier has its own measured start-up time."""

    HOT = "hot"  # engine loaded (idle or in vLLM sleep mode)
    WARM = "warm"  # node up, weights on local NVMe
    COLD = "cold"  # node to provision, weights to download


@dataclass(frozen=True)
class ReplicaSnapshot:
    replica_id: str
    state: ReplicaState
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0  # fraction of KV blocks in use, 0..1


@dataclass(frozen=True)
class Snapshot:
    now: float
    replicas: tuple[ReplicaSnapshot, ...]
    # TTFT samples (seconds) that completed inside the policy's look-back window.
    ttft_samples_s: tuple[float, ...] = ()
    # Per-request mean time per output token (seconds: (finish - first token) / (output - 1))
    # of requests that completed inside the look-back window; requests of one output token
    # have none.
    tpot_samples_s: tuple[float, ...] = ()
    # Requests per second that arrived over the look-back window.
    arrival_rate_rps: float = 0.0
    # Requests held at the ingress because no replica was active (scale-from-zero).
    pending_at_ingress: int = 0
    # Nodes up with the model's weights on local NVMe and free GPUs: each can start a replica
    # within the WARM start-up time. 0 when unknown; a policy then plans with the COLD time.
    warm_ready: int = 0

    def count(self, state: ReplicaState) -> int:
        return sum(1 for r in self.replicas if r.state is state)


@dataclass(frozen=True)
class ScaleDecision:
    target_active: int
    # Replicas to keep ready per tier, beyond the active ones.
    target_standby: dict[Tier, int] = field(default_factory=dict)
    reason: str = ""
    # Of target_active, the least the burst envelope keeps through a lull (autoscale/envelope.py);
    # 0 when it holds none or is off.
    burst_hold: int = 0
    # Replicas a symptom or the rate asked for and the policy did not order: they would arrive after the
    # burst (autoscale/memory/in_time.py `late_starts`, "not in time" in the reason).
    not_in_time: int = 0
