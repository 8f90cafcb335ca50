"""What the request router sees and returns (routing/choose.py), shared by both drivers: the
live ingress fills ReplicaLoad from the replicas' own stats, the simulator from its engines."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass, field
from enum import Enum

from hbmserve.core.scaling import ReplicaState

# Characters per token of English text: how the front door sizes a prompt before any tokenizer
# has seen it, and how a replica sizes one whose reply carries no token counts.
CHARS_PER_TOKEN = 4


class PrefixSource(str, Enum):
    """Where the router learns what each replica's prefix cache holds."""

    EVENTS = "events"  # the engines' own KV events, through the KV index (kvindex/index.py)
    ROUTED = "routed"  # what was routed there lately (routing/prefix.py RecentPrefixes)


@dataclass(frozen=True)
class ReplicaLoad:
    replica_id: str
    state: ReplicaState
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    # Prefix block hashes (routing/prefix.py) this replica holds in its prefix cache, read only;
    # may be a live view of the engine's cache, or what the caller routed there recently.
    cached_prefixes: Set[int] = field(default_factory=frozenset)
    # Hashes its host-memory KV tier holds (the KV index's view; empty without a host tier).
    host_prefixes: Set[int] = field(default_factory=frozenset)
    # LoRA adapters it holds (registered in its engine) and how many it may hold at once.
    adapters: Set[str] = field(default_factory=frozenset)
    adapter_slots: int = 0


@dataclass(frozen=True)
class RouteRequest:
    prompt_tokens: int
    max_tokens: int
    # Chained block hashes of the prompt, first block first (routing/prefix.py): hash i equal
    # means blocks 0..i equal. Empty: no affinity.
    prefix_hashes: tuple[int, ...] = ()
    # The caller's request counter (0, 1, 2, ...): round robin takes it modulo the replicas, and
    # the randomised picks (power of two) mix it into a pseudo-random draw, so a run is replayable.
    salt: int = 0
    # What a block found in a host tier is worth against one found in HBM: the share of its
    # prefill time that loading it over PCIe saves (capacity/perf/perf_model.py host_block_value).
    host_block_value: float = 0.0
    # The LoRA adapter the request names; None: the base model (or a router blind to adapters).
    adapter: str | None = None


@dataclass(frozen=True)
class RouteDecision:
    ranked: tuple[str, ...]  # best first; empty when no replica is eligible
    reason: str


# A router: a model's replica loads and one request in, the replicas ranked out (with the
# reason). `routing.choose` is hbmserve's; routing/routers.py registers it beside the baselines.
# The front door (deployments/ingress/front_door_app.py) and the simulator (capacity/sim/cluster_sim.py) both call one
# through this type, by the name in `serve.router`.
Router = Callable[[Iterable[ReplicaLoad], RouteRequest], RouteDecision]
