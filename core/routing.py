"""What the request router sees and returns (routing/choose.py), shared by both drivers: the
live ingress fills ReplicaLoad from the replicas' own stats, the simulator from its engines."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field

from hbmserve.core.scaling import ReplicaState


@dataclass(frozen=True)
class ReplicaLoad:
    replica_id: str
    state: ReplicaState
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    # Prefix hashes this replica holds in its prefix cache (read only; may be a live set view).
    cached_prefixes: Set[int] = field(default_factory=frozenset)


@dataclass(frozen=True)
class RouteRequest:
    prompt_tokens: int
    max_tokens: int
    prefix_hash: int | None = None


@dataclass(frozen=True)
class RouteDecision:
    ranked: tuple[str, ...]  # best first; empty when no replica is eligible
    reason: str
