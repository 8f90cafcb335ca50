"""What a front door reports about itself (its `info()` over a Serve handle), per model and per
adapter: read by `hbmserve status` and the ops dashboard. The records of core/records.py, for
the door's side; the same JSON rules (core/records.py's docstring).
"""

from __future__ import annotations

from dataclasses import dataclass

from hbmserve.core.records import Record


@dataclass(frozen=True, kw_only=True)
class KvRouting(Record):
    """One front door's KV index for one model (deployments/kv/door_kv.py), for `status`."""

    streams: int  # replicas whose KV event stream is up
    hbm_blocks: int
    host_blocks: int
    untrusted: int  # replicas routed on load now (a gap being replayed, lag past the bound)
    max_lag_s: float
    batches: int  # event batches applied
    lost: int  # batches unreadable, plus gaps that replay could not fill
    hashed: int  # requests hashed as the engines hash them
    hash_ms: float  # the door's time doing it, per request


@dataclass(frozen=True, kw_only=True)
class AdapterTraffic(Record):
    """One front door's figures for one LoRA adapter (deployments/ingress/adapter_meter.py)."""

    model: str  # its base model
    adapter: str
    requests: int  # answered by a replica, at this door
    failed: int  # of those, not 200
    prompt_tokens: int
    completion_tokens: int
    ttft_p95_s: float | None  # streamed replies of the last minute
    loads: int  # by the replicas on this door's node (summed over doors: every replica once)
    unloads: int
    resident: int  # replicas on this door's node holding it now


@dataclass(frozen=True, kw_only=True)
class ModelTraffic(Record):
    """One front door's view of one model."""

    model: str
    accepted: int  # admitted since the front door started
    rejected: int  # 429/503 answers of admission
    in_flight: int  # admitted and not finished, queued ones included
    queued: int  # admitted, waiting for a replica (scale from zero, burst)
    routable: int  # active replicas this front door reaches now
    retried: int = 0  # requests whose replica failed before answering, sent to another once
    migrated: int = 0  # streams that broke mid-way and went on from another replica
    migration_failed: int = 0  # broken streams that could not go on (limit spent, not resumable)
    kv: KvRouting | None = None  # set where the model's engines publish KV events
    adapters: tuple[AdapterTraffic, ...] = ()  # its LoRA adapters
    # A disaggregated model (issue 23): `routable` counts its decode pool, this its prefill pool;
    # and its requests by how they ran (deployments/ingress/two_phase.py outcomes).
    prefill_routable: int | None = None
    two_phase: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, kw_only=True)
class IngressInfo(Record):
    """What a front door (deployments/ingress/front_door.py) reports about itself."""

    node_id: str
    url: str  # the cluster's endpoint on this node: the same port on every node
    own_url: str  # this front door alone (an ephemeral port), for probes and tests
    auth: bool  # API keys enforced
    connections: int  # client connections open now
    rss_mib: float  # the front door process's resident memory
    models: tuple[ModelTraffic, ...]
