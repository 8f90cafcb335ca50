"""The ops dashboard's data: one front door's picture of the cluster, built by pure functions.

    sample = build_sample(now, models)                        # every SAMPLE_S, into a ring
    snapshot = build_snapshot(now, door, samples, models, logs, topology)   # per page refresh

Typed inputs in, a frozen `DashboardSnapshot` out (`to_json` is what `/hbm/dashboard/data`
answers); no I/O, no clock. The front door gathers the inputs (dashboard_feed.py) from what it
already keeps: its replica table (each replica's announced endpoint, with the placement report a
planned replica publishes, and its polled load), its admission queues, the autoscaler's decision
records and their log (records_store.py), and the cluster's topology file.

It lives in deployments/ingress/, not ops/, because the front door serves it and a room may not import
ops (tests/unit/test_layers.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from hbmserve.core.records import DecisionRecord, PlacementReport, Record, ReplicaRoles
from hbmserve.core.door_records import AdapterTraffic, KvRouting
from hbmserve.core.rollout_records import RolloutRecord
from hbmserve.placement.topology import ClusterTopology

# Samples kept by each front door: 300 x SAMPLE_S = 10 minutes of history.
SAMPLE_S = 2.0
HISTORY = 300
DECISIONS_SHOWN = 50


@dataclass(frozen=True, kw_only=True)
class ReplicaView(Record):
    """One replica as the front door knows it (replica_table.KnownReplica, frozen)."""

    replica: str  # Serve's replica id
    node_id: str  # Ray node id
    reachable: bool  # its last load poll answered
    waiting: int
    running: int
    kv_usage: float
    placement: PlacementReport | None = None
    prompt_tokens: int = 0  # since the replica started, looked up in its prefix cache
    prefix_hit_tokens: int = 0  # of those, found there


@dataclass(frozen=True, kw_only=True)
class ClientLatency(Record):
    """The client-side view measured at this front door (dashboard_feed.ReplyWindow): from a
    request's arrival at the door to its first relayed byte (TTFT), the gaps between relayed
    tokens (TPOT), and output tokens relayed per second. Not the engines' own histograms: it
    includes the door's queue and the network hop, which is what a client sees."""

    ttft_p95_s: float | None = None
    tpot_p95_s: float | None = None
    tokens_per_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class ModelInputs(Record):
    """Everything the builders need about one model, gathered by the front door."""

    model: str
    ttft_slo_s: float
    tpot_slo_s: float
    usd_per_replica_hour: float | None  # GPUs per replica x catalog price; None: unknown GPU
    fixed_replicas: int | None  # the config's count; None when autoscaled
    decision: DecisionRecord | None  # the policy's latest (autoscaled models)
    replicas: tuple[ReplicaView, ...]
    held: int  # requests queued at this front door
    latency: ClientLatency


@dataclass(frozen=True, kw_only=True)
class ModelSample(Record):
    model: str
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    queue_depth: int  # held at this front door + waiting in the engines' own queues
    roles: ReplicaRoles
    tokens_per_s: float
    usd_per_hour: float | None
    # Summed over the model's replicas since each started: the page draws the hit rate between
    # two samples from their differences.
    prompt_tokens: int = 0
    prefix_hit_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class DashboardSample(Record):
    at: float  # wall clock
    models: tuple[ModelSample, ...]


@dataclass(frozen=True, kw_only=True)
class LoggedDecision(Record):
    model: str
    decision: DecisionRecord


@dataclass(frozen=True, kw_only=True)
class GpuCell(Record):
    """One GPU of the topology and the replica rank on it, if any."""

    gpu: int
    island: str  # the planning island (NVLink component or multi-node domain) it belongs to
    model: str | None = None
    replica: str | None = None
    plan_index: int | None = None  # the replica's index in its model's placement plan
    rank: int | None = None
    verified: bool | None = None  # the replica's placement_verified


@dataclass(frozen=True, kw_only=True)
class NodeRow(Record):
    node: str  # the topology's node name (the hbmserve.io/node label)
    gpus: tuple[GpuCell, ...]


@dataclass(frozen=True, kw_only=True)
class PlacedReplica(Record):
    """Every replica, planned or not: where its ranks are and whether its plan held."""

    model: str
    replica: str
    node_id: str
    role: str  # active / standby / draining
    ranks: tuple[str, ...]  # "node:gpu" by rank; () when not planned
    verified: bool | None  # None when not planned
    reason: str  # the verification's reason, or why there is none
    crossed_groups: int


@dataclass(frozen=True, kw_only=True)
class PlacementMap(Record):
    nodes: tuple[NodeRow, ...]  # () without a topology file
    replicas: tuple[PlacedReplica, ...]


@dataclass(frozen=True, kw_only=True)
class ModelSlo(Record):
    model: str
    ttft_p95_s: float
    tpot_p95_s: float


@dataclass(frozen=True, kw_only=True)
class ModelKvIndex(Record):
    """This door's KV index for a model whose engines publish KV events."""

    model: str
    index: KvRouting


@dataclass(frozen=True, kw_only=True)
class DashboardSnapshot(Record):
    at: float
    door: str  # the Ray node id of the front door that answered
    doors: int  # live front doors; latency and tokens/s are this door's share of the traffic
    auth: bool
    slo: tuple[ModelSlo, ...]
    history: tuple[DashboardSample, ...]  # oldest first
    current: tuple[LoggedDecision, ...]  # each autoscaled model's latest decision (every tick)
    decisions: tuple[LoggedDecision, ...]  # the plan changes, newest first
    placement: PlacementMap
    rollouts: tuple[RolloutRecord, ...] = ()  # each model's last rollout (cluster/rolling_deploy.py)
    kv: tuple[ModelKvIndex, ...] = ()  # this door's KV index per model (deployments/kv/door_kv.py)
    adapters: tuple[AdapterTraffic, ...] = ()  # each LoRA adapter (deployments/ingress/adapter_meter.py)


def _role(replica: str, decision: DecisionRecord | None) -> str:
    if decision is None or replica in decision.active_replicas:
        return "active"
    return "standby" if replica in decision.standby_replicas else "draining"


def role_counts(m: ModelInputs) -> ReplicaRoles:
    """Roles from the decision's lists; a model with fixed replicas has only active ones and those
    still loading. Starting: replicas Serve was asked for (serve_target) not yet announced."""
    roles = [_role(r.replica, m.decision) for r in m.replicas]
    active, standby = roles.count("active"), roles.count("standby")
    wanted = m.decision.serve_target if m.decision is not None else (m.fixed_replicas or 0)
    return ReplicaRoles(starting=max(0, wanted - active - standby), active=active, standby=standby,
                      draining=roles.count("draining"))


def model_sample(m: ModelInputs) -> ModelSample:
    roles = role_counts(m)
    # Every replica but the warm pool holds its GPUs, starting and draining ones too.
    billed = roles.starting + roles.active + roles.standby + roles.draining
    cost = None if m.usd_per_replica_hour is None else billed * m.usd_per_replica_hour
    return ModelSample(model=m.model, ttft_p95_s=m.latency.ttft_p95_s, tpot_p95_s=m.latency.tpot_p95_s,
                       queue_depth=m.held + sum(r.waiting for r in m.replicas), roles=roles,
                       tokens_per_s=m.latency.tokens_per_s, usd_per_hour=cost,
                       prompt_tokens=sum(r.prompt_tokens for r in m.replicas),
                       prefix_hit_tokens=sum(r.prefix_hit_tokens for r in m.replicas))


def build_sample(now: float, models: tuple[ModelInputs, ...]) -> DashboardSample:
    return DashboardSample(at=now, models=tuple(model_sample(m) for m in models))


def placement_map(models: tuple[ModelInputs, ...], topology: ClusterTopology | None) -> PlacementMap:
    """The topology's nodes x GPUs, each GPU with its island and the replica rank observed on it,
    and every replica with its ranks and verification. A rank whose GPU the probe saw only by
    UUID is listed with its replica but drawn on no cell."""
    occupant: dict[tuple[str, int], tuple[str, str, PlacementReport, int]] = {}
    replicas = []
    for m in models:
        for r in m.replicas:
            p = r.placement
            if p is not None:
                for o in p.observed:
                    if isinstance(o.gpu, int):
                        occupant[(o.node, o.gpu)] = (m.model, r.replica, p, o.rank)
            replicas.append(PlacedReplica(
                model=m.model, replica=r.replica, node_id=r.node_id, role=_role(r.replica, m.decision),
                ranks=tuple(f"{o.node}:{o.gpu}" for o in sorted(p.observed, key=lambda o: o.rank)) if p else (),
                verified=p.placement_verified if p else None,
                reason=p.reason if p else "not planned (no topology, or a model without GPUs)",
                crossed_groups=len(p.crossed) if p else 0))
    nodes = []
    if topology is not None:
        island_of = {(ref.node, ref.gpu): island.id for island in topology.islands() for ref in island.members}
        for node in topology.nodes:
            cells = []
            for gpu in node.gpus:
                held = occupant.get((node.name, gpu.index))
                cells.append(GpuCell(gpu=gpu.index, island=island_of[(node.name, gpu.index)]) if held is None else
                             GpuCell(gpu=gpu.index, island=island_of[(node.name, gpu.index)], model=held[0],
                                     replica=held[1], plan_index=held[2].replica, rank=held[3],
                                     verified=held[2].placement_verified))
            nodes.append(NodeRow(node=node.name, gpus=tuple(cells)))
    return PlacementMap(nodes=tuple(nodes), replicas=tuple(replicas))


def build_snapshot(now: float, door: str, doors: int, auth: bool, history: tuple[DashboardSample, ...],
                   models: tuple[ModelInputs, ...], logs: dict[str, tuple[DecisionRecord, ...]],
                   topology: ClusterTopology | None, rollouts: tuple[RolloutRecord, ...] = (),
                   kv: tuple[ModelKvIndex, ...] = (), adapters: tuple[AdapterTraffic, ...] = ()) -> DashboardSnapshot:
    """`logs`: each autoscaled model's plan changes (records_store.recent_decisions), oldest first."""
    logged = sorted((LoggedDecision(model=name, decision=d) for name, ds in logs.items() for d in ds),
                    key=lambda e: e.decision.at, reverse=True)
    return DashboardSnapshot(
        at=now, door=door, doors=doors, auth=auth,
        slo=tuple(ModelSlo(model=m.model, ttft_p95_s=m.ttft_slo_s, tpot_p95_s=m.tpot_slo_s) for m in models),
        history=history,
        current=tuple(LoggedDecision(model=m.model, decision=m.decision) for m in models if m.decision is not None),
        decisions=tuple(logged[:DECISIONS_SHOWN]), placement=placement_map(models, topology), rollouts=rollouts,
        kv=kv, adapters=adapters)
