"""What an engine says about its KV cache, and what the KV index answers: shared by the simulated
engine (which publishes), the live subscriber (which decodes vLLM's ZMQ stream into these), the
index (kvindex/index.py) and the router.

The events mirror vLLM's (vllm/distributed/kv_events.py): a block became cached (`BlockStored`,
with the hash of the block before it, so a chain can be followed), blocks left the cache
(`BlockRemoved`), or the whole cache was dropped (`AllBlocksCleared`, after a reset). Each event
names the tier it happened in: HBM, or the host-memory tier of an offloading connector. A batch
is one engine step's events with the publisher's sequence number, which is what lets a
subscriber see that it missed some.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field
from enum import Enum


class Medium(str, Enum):
    HBM = "GPU"  # vLLM's names, so a decoded event maps one to one
    HOST = "CPU"


@dataclass(frozen=True)
class BlockStored:
    hashes: tuple[int, ...]  # consecutive blocks of one sequence, first first
    parent: int | None = None  # the block before hashes[0]; None: it starts a sequence
    medium: Medium = Medium.HBM


@dataclass(frozen=True)
class BlockRemoved:
    hashes: tuple[int, ...]
    medium: Medium = Medium.HBM


@dataclass(frozen=True)
class AllBlocksCleared:
    medium: Medium | None = None  # None: every tier


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class KvEventBatch:
    replica_id: str
    seq: int  # the publisher's counter: 0, 1, 2, ... with no gaps
    ts: float  # when the engine published it (seconds, the cluster's clock)
    events: tuple[KvEvent, ...]


@dataclass(frozen=True)
class ReplicaKv:
    """What the index believes one replica holds, read only (live views; do not keep them)."""

    hbm: Set[int] = field(default_factory=frozenset)
    host: Set[int] = field(default_factory=frozenset)
    # False while the index cannot vouch for the view (a gap waiting for replay, or events
    # older than the lag bound): the router then treats the replica as holding nothing.
    trusted: bool = True
    why: str = ""
