"""The records one process hands to another, typed, each with one JSON form.

* `DecisionRecord`: what the autoscaling policy (in Serve's controller) publishes per decision.
  Read by the front doors (they route only to the replicas it lists active), `hbmserve status`
  and the benchmarks.
* `ReplicaEndpoint`: a replica's announcement of where it listens (and, planned, where its
  ranks landed), renewed while it lives. Read by the front doors.
* `DoorEndpoint`: a front door's announcement, renewed while it lives. Read by the front doors.
* `LoadReport`: a replica's load, which the front doors poll to route.
* `IngressDemand`: the demand one front door sees for a model that the replicas do not: requests
  it holds (no active replica, or a burst) and the rate it refuses for want of capacity. Renewed
  while nonzero; read by the autoscaling policy.
* `ReplicaInfo`: what an engine replica reports about itself (its `info()` over a Serve handle),
  with a `PlacementReport` when the replica was placed by the planner. Read by `hbmserve status`.
* `IngressInfo` (core/door_records.py): the same for a front door.
* `WarmTierRecord`: what the warm-tier aggregator (deployments/control/warm_tier.py) asked of Ray's node
  autoscaler and prefetched onto joining nodes, renewed while it runs. Read by the autoscaling
  policy (a live warm pool only while it is fresh) and by `hbmserve status`.
* `SlotStats`: one planned slot's replica stats, from its Serve policy to the model's leading
  policy (a model both autoscaled and placed runs one deployment per planned slot).

A record that a component renews (`at` on the writer's wall clock) is read only while fresh:
a component that dies stops renewing, so what it published cannot outlive it.

Frozen dataclasses inside; pydantic only at the edge, in `from_json`/`from_dict`, in strict
mode (a string is not a number, `true` is not 1). Where the records travel (Ray's internal KV,
Serve handle replies) is deployments/wire/records_store.py's business; this module knows only shapes.

Readers are version-tolerant, so a writer and a reader from different hbmserve versions (a
rolling upgrade, a newer CLI against an older cluster) still understand each other:

* fields the reader does not know are ignored (a newer writer added them);
* fields added after a record's first version have defaults (an older writer lacks them);
* anything else missing or mistyped raises `RecordError`, naming the record, where it came from
  and the field, instead of a KeyError somewhere in a consumer.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, TypeVar

from pydantic import TypeAdapter, ValidationError

from hbmserve.core.scaling import ReplicaState, Tier

R = TypeVar("R", bound="Record")



class RecordError(ValueError):
    """A record read back is not one this version understands; the message says which and why."""


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    # Built on first use, not at import: a schema build costs milliseconds per type.
    return TypeAdapter(cls)


def _describe(err: ValidationError) -> str:
    problems = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"])
        if e["type"] == "missing":
            problems.append(f"field '{where}' is missing")
        elif e["type"] == "json_invalid":
            problems.append(f"not valid JSON ({e['msg']})")
        elif not where:
            problems.append(f"{e['msg']}, got {type(e['input']).__name__}")
        else:
            problems.append(f"field '{where}': {e['msg']}, got {e['input']!r:.80}")
    return "; ".join(problems)


class Record:
    """JSON round trip for the frozen dataclasses that subclass it (a mixin: no fields)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data: enums as their values, tuples as lists, fields in declared order."""
        return _adapter(type(self)).dump_python(self, mode="json")

    def to_json(self) -> str:
        return _adapter(type(self)).dump_json(self).decode()

    @classmethod
    def from_json(cls: type[R], raw: str | bytes, source: str = "") -> R:
        """Parse and check `raw`; `source` (e.g. the KV key) goes into the error message."""
        try:
            return _adapter(cls).validate_json(raw, strict=True)
        except ValidationError as err:
            where = f" from {source}" if source else ""
            raise RecordError(f"malformed {cls.__name__}{where}: {_describe(err)}") from None

    @classmethod
    def from_dict(cls: type[R], data: Any, source: str = "") -> R:
        """The same check for data already decoded (a Serve handle reply, Serve's policy_state).
        Through JSON on purpose: one set of rules (strict JSON mode) for both ways in."""
        try:
            raw = json.dumps(data)
        except (TypeError, ValueError) as err:
            where = f" from {source}" if source else ""
            raise RecordError(f"malformed {cls.__name__}{where}: not JSON data ({err})") from None
        return cls.from_json(raw, source)


@dataclass(frozen=True, kw_only=True)
class Histogram(Record):
    """Counts since the engine started. `cumulative[i]` observations were <= `bounds[i]`;
    `count` is the +Inf bucket (every observation). Only finite bounds are kept: JSON has no inf."""

    bounds: tuple[float, ...]  # ascending, finite
    cumulative: tuple[float, ...]
    count: float
    sum: float = 0.0


@dataclass(frozen=True, kw_only=True)
class DecisionRecord(Record):
    """One autoscaling decision for one engine deployment, published on every policy tick."""

    at: float  # the policy's clock at the decision (Serve's AutoscalingContext.current_time)
    target_active: int  # replicas the policy wants serving traffic
    # Replicas to keep ready per tier beyond the active ones: HOT are loaded engines Serve runs;
    # WARM and COLD are for a node-pool executor (none yet).
    target_standby: Mapping[Tier, int]
    # Serve replica ids assigned traffic: the front doors route only to these.
    active_replicas: tuple[str, ...]
    standby_replicas: tuple[str, ...]  # running, engine loaded, out of rotation
    # Requests the front doors held when the policy decided (added with scale to zero).
    held_at_ingress: int = 0
    # Requests/s the front doors refused for capacity, counted as arrivals (added with it).
    refused_rps_at_ingress: float = 0.0
    # Start-up seconds per tier the policy planned with; WARM is what the replicas measured.
    # Added with measured start-up.
    startup_s: Mapping[Tier, float] = field(default_factory=dict)
    # Replicas the burst envelope holds through lulls (autoscale/envelope.py). Added with it.
    burst_hold: int = 0
    # Replicas not ordered because they would arrive after the burst ("not in time" in the
    # reason); the prior the envelope started from (autoscaling.prior's learned_from, "" none)
    # and what it alone holds before any traffic. Added with issue 38.
    not_in_time: int = 0
    prior_source: str = ""
    prior_hold: int = 0
    reason: str  # why, for people: the policy's reason and any role change
    serve_target: int  # replicas asked of Serve: the active ones plus the hot standbys


@dataclass(frozen=True, kw_only=True)
class SlotStats(Record):
    """What one planned slot's Serve autoscaling context held, for the model's leading policy
    (deployments/control/slot_autoscaling.py): a model both autoscaled and placed by the planner runs one
    Serve deployment per planned slot, and each policy sees only its own slot's replicas."""

    at: float  # the slot policy's clock (Serve's AutoscalingContext.current_time)
    slot: int
    target: int  # Serve's target for the slot's deployment: 0 or 1
    current: int  # replicas it runs
    # Serve replica id -> stat name -> (timestamp, value) points: the look-back window and the latest.
    replicas: Mapping[str, Mapping[str, tuple[tuple[float, float], ...]]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class CrossedGroup(Record):
    """A TP group that did not land on the island its plan chose."""

    stage: int  # pipeline stage
    crossing: str  # placement/verification.py's Crossing value ("island", "node", ...)
    planned_island: str
    observed: tuple[str | None, ...]  # where each rank landed ("node:gpu"; None: unresolved)
    extra_allreduce_us: float  # the all-reduce cost the crossing adds per step


@dataclass(frozen=True, kw_only=True)
class ObservedRank(Record):
    rank: int
    node: str
    gpu: int | str | None  # index when the probe could read it, else the GPU's UUID


@dataclass(frozen=True, kw_only=True)
class KvEventsInfo(Record):
    """A replica whose engine publishes its KV events (deployments/kv/kv_stream.py) and how the
    engine names its blocks, so a front door can hash a prompt as the engine does."""

    hashing: str  # HASHING_VLLM or HASHING_TEXT
    block_size: int  # tokens per KV block


# vLLM's sha256_cbor chain over token ids (routing/engine_hashes.py): the door tokenizes first.
HASHING_VLLM = "vllm-sha256_cbor"
# The simulated engine's: routing/prefix.py prompt_block_hashes over the prompt's text, 64
# characters a block (deployments/replica/sim_server.py prefix_hashes): no tokenizer needed.
HASHING_TEXT = "hbmserve-text64"


@dataclass(frozen=True, kw_only=True)
class PlacementReport(Record):
    """A planned replica's check of where its ranks landed against its plan."""

    replica: int  # index of the replica in the model's placement plan
    placement_verified: bool  # every TP group sits where the plan put it
    reason: str
    crossed: tuple[CrossedGroup, ...]
    expected_extra_allreduce_us: float
    observed: tuple[ObservedRank, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ReplicaInfo(Record):
    """What an engine replica reports about itself (deployments/apps/model_app.py `info()`)."""

    model: str
    engine: str  # the EngineKind value; a string so that a reader need not know every engine
    url: str  # this replica's private HTTP server; only the front door may use it
    role: ReplicaState  # ACTIVE is routed to; STANDBY is loaded but not routed to
    replica: str  # Serve's replica id: what DecisionRecord.active_replicas lists
    node_id: str  # Ray node id
    pid: int
    in_flight: int  # requests admitted and not finished
    engine_waiting: int
    engine_running: int
    kv_usage: float  # 0..1
    accepted: int  # since the replica started
    rejected: int  # 429s since the replica started
    healthy: bool
    # Seconds from the replica's constructor to a loaded engine (added after the first version).
    load_s: float | None = None
    # Making the weights local through the node's cache (vLLM engines; added with the cache):
    # seconds, and whether they were already there (a hit) or were fetched from the source.
    weights_s: float | None = None
    weights_cached: bool | None = None
    placement: PlacementReport | None = None  # planned replicas only (deployments/apps/placed_app.py)
    # Prefix cache since start: prompt tokens looked up, and those found (added with the front door).
    prompt_tokens: int = 0
    prefix_hit_tokens: int = 0
    # The engine's own latency histograms since start (vLLM's time_to_first_token and
    # request_time_per_output_token, or the sim engine's copies), and the model's SLO and this
    # replica's price (its GPUs at the catalog or configured price). Added with the metrics.
    ttft_histogram: Histogram | None = None
    tpot_histogram: Histogram | None = None
    slo_ttft_p95_s: float | None = None
    slo_tpot_p95_s: float | None = None
    usd_per_hour: float | None = None
    # A standby whose engine sleeps (autoscaling.hot_standby.sleep; deployments/replica/standby_sleep.py),
    # and its last wake in seconds, wake_up() called to done: the sleeping tier's measured
    # start-up (None: never woken). Added with the live sleep mode.
    sleeping: bool = False
    wake_s: float | None = None

    @property
    def placement_verified(self) -> bool | None:
        return None if self.placement is None else self.placement.placement_verified


@dataclass(frozen=True, kw_only=True)
class ReplicaRoles(Record):
    """How many of a model's replicas are in each role (`hbmserve status`, the role gauge)."""

    starting: int = 0  # being brought up: engine loading, not announced yet
    active: int = 0  # routed to
    standby: int = 0  # hot: loaded, out of rotation
    draining: int = 0  # finishing in-flight requests before removal
    warm: int = 0  # the warm pool the policy sized (nodes with weights, no engine; live: planned only)


@dataclass(frozen=True, kw_only=True)
class ReplicaEndpoint(Record):
    """Where one engine replica serves; renewed every few seconds while the replica lives."""

    app: str  # Serve application (the model's name)
    deployment: str
    replica: str  # Serve's replica id: what DecisionRecord.active_replicas lists
    model: str
    url: str
    node_id: str
    at: float  # wall clock of the last renewal
    # Where a planned replica's ranks landed (deployments/apps/placed_app.py), published with its
    # address so that a front door, which reaches replicas over HTTP only, can draw the placement
    # map (deployments/ingress/dashboard.py). None: not planned. Added with the ops dashboard.
    placement: PlacementReport | None = None
    # Stopping: the front doors send it nothing new and let its streams finish (added with rollouts).
    draining: bool = False
    # Set when its engine publishes KV events: the doors route by them (added with KV-aware routing).
    kv_events: KvEventsInfo | None = None
    # The pool of a disaggregated model it serves ("prefill" or "decode"); None: both phases.
    role: str | None = None

    def fresh(self, now: float, ttl_s: float) -> bool:
        return now - self.at <= ttl_s


@dataclass(frozen=True, kw_only=True)
class AdapterHolding(Record):
    """A replica's LoRA adapters (deployments/replica/replica_middleware.py AdapterRegistry): those registered in
    its engine, least recently used first, its slots, and loads and unloads per adapter so far."""

    resident: tuple[str, ...] = ()
    slots: int = 0
    loads: tuple[tuple[str, int], ...] = ()
    unloads: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, kw_only=True)
class LoadReport(Record):
    """A replica's load now (`GET /hbm/load`, polled by the front doors)."""

    waiting: int  # the engine's own queue
    running: int
    kv_usage: float  # 0..1
    in_flight: int  # admitted by the replica and not finished
    accepted: int
    rejected: int
    prompt_tokens: int = 0  # since start, looked up in the prefix cache
    prefix_hit_tokens: int = 0  # of those, found there
    adapters: AdapterHolding = AdapterHolding()


@dataclass(frozen=True, kw_only=True)
class DoorEndpoint(Record):
    """A front door's announcement, renewed while it lives: the front doors count each other to
    split each model's admission capacity between them."""

    door: str
    node_id: str
    url: str  # this front door alone
    at: float  # wall clock of the last renewal


@dataclass(frozen=True, kw_only=True)
class IngressDemand(Record):
    """Demand at one front door (or summed over all of them) that never reached a replica."""

    held: int  # requests queued at the door, waiting for a replica
    # Requests/s refused for capacity (429 queue full or SLO unreachable, 503 waited too long)
    # over the last 30 s. Tenant rate limits, auth and malformed requests are not demand.
    refused_rps: float = 0.0
    at: float  # wall clock of the last renewal


@dataclass(frozen=True, kw_only=True)
class Prefetch(Record):
    """One model made local on one node by the warm tier's prefetch."""

    node_id: str
    model: str
    ok: bool
    hit: bool = False  # it was already in that node's cache
    bytes_fetched: int = 0
    seconds: float = 0.0
    error: str = ""  # why it failed, when it did


@dataclass(frozen=True, kw_only=True)
class WarmTierRecord(Record):
    """The warm-tier aggregator's state, renewed every tick while it runs (one per cluster)."""

    at: float  # wall clock of the last renewal
    # A node autoscaler runs (Ray's autoscaler reports its status); without one, no node is added.
    node_autoscaler: bool
    # Deployments whose warm wish can become nodes: replicas that need node resources (a GPU)
    # and weights that go through the node's cache.
    warmable: tuple[str, ...]
    bundles: tuple[dict[str, float], ...]  # the one request_resources list in force
    reason: str  # why these bundles
    prefetched: tuple[Prefetch, ...] = ()  # newest last, bounded
