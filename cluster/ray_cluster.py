"""Thin adapter to Ray: connect, deploy a ClusterSpec, read status (the local head: local_head.py)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass

from hbmserve.cluster.local_head import LOCAL_GCS_PORT, ClusterError, local_head_env, port_open
from hbmserve.core.config import ClusterSpec
from hbmserve.cluster.status_figures import LatencyVsSlo, latency_vs_slo, status_roles, usd_per_hour
from hbmserve.core.records import (DecisionRecord, PlacementReport, Record, RecordError, ReplicaInfo, ReplicaRoles,
                                   WarmTierRecord)
from hbmserve.core.door_records import IngressInfo, ModelTraffic
from hbmserve.core.rollout_records import DeployedRecord, RolloutRecord
from hbmserve.core.scaling import ReplicaState
from hbmserve.deployments.wire.names import FRONT_DOOR_APP, FRONT_DOOR_DEPLOYMENT, WARM_TIER_APP, engine_deployment_name

NAMESPACE = "hbmserve"


def connect(address: str | None) -> str:
    """Connect this process to a cluster; `address` None means RAY_ADDRESS or the local head."""
    addr = address or os.environ.get("RAY_ADDRESS") or f"127.0.0.1:{LOCAL_GCS_PORT}"
    if addr == f"127.0.0.1:{LOCAL_GCS_PORT}" and "ray" not in sys.modules:
        os.environ.update(local_head_env())  # before Ray is imported: it reads them once
    import ray

    if ray.is_initialized():
        return addr
    if not port_open(addr.removeprefix("ray://")):
        raise ClusterError(f"no Ray cluster answers at {addr}. Start one with `hbmserve up`, or set RAY_ADDRESS.")
    try:
        ray.init(address=addr, namespace=NAMESPACE, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError) as err:
        raise ClusterError(f"cannot reach a Ray cluster at {addr}: {err}. Start one with `hbmserve up`, "
                           "or set RAY_ADDRESS.") from None
    return addr


def deployment_gone() -> str | None:
    """Why the deployment this process made is no longer there, or None while it is: the Ray
    cluster stopped answering, or the front door application was removed (`hbmserve down`)."""
    import ray
    from ray import serve

    address = ray.get_runtime_context().gcs_address
    if not port_open(address):
        return f"the Ray cluster at {address} is gone"
    try:
        apps = serve.status().applications
    except Exception as err:  # noqa: BLE001 - Serve's controller is gone: nothing serves any more
        return f"Serve was shut down on the cluster (by `hbmserve down`?): {type(err).__name__}"
    return None if FRONT_DOOR_APP in apps else "the deployment was removed (by `hbmserve down`?)"


def disconnect() -> None:
    import ray

    ray.shutdown()


def deploy(spec: ClusterSpec) -> dict[str, str]:
    """Deploy every model of `spec` as its own Serve application, and the front door on every
    node; waits until the front door answers. Returns model name -> endpoint URL (one URL for
    all: the front door routes by the request's `model`)."""
    import secrets

    import ray
    from ray import serve

    from hbmserve.deployments.apps.service_apps import build_front_door_app
    from hbmserve.deployments.ingress.front_door_access import AccessConfigError, load_key_ring
    from hbmserve.deployments.apps.model_app import build_model_app, unsupported_engines
    from hbmserve.deployments.wire.records_store import publish_deployed

    problems = unsupported_engines(spec)
    if problems:
        raise ClusterError("cannot deploy:\n  " + "\n  ".join(problems))
    try:
        load_key_ring(spec.serve.auth)  # here first, for a clear error before anything starts
    except AccessConfigError as err:
        raise ClusterError(f"cannot deploy: {err}") from None
    plans = _placement_plans(spec)  # before Serve starts: an infeasible plan deploys nothing
    # No Serve proxy: the front door carries the bytes (deployments/ingress/front_door.py says why).
    serve.start(proxy_location="Disabled", http_options={"host": spec.serve.http.host})
    # A model removed, or a version a rollout left (`<model>@2`): its GPUs go to what deploys now.
    for name in set(serve.status().applications) - {m.name for m in spec.models} - {FRONT_DOOR_APP, WARM_TIER_APP}:
        serve.delete(name)
    # Proves the front door to the replicas; new per deploy, so every app deployed now uses it.
    token = secrets.token_urlsafe(32)
    for m in spec.models:
        if m.name in plans:
            from hbmserve.deployments.apps.placed_app import build_placed_app

            result, topology = plans[m.name]
            app = build_placed_app(spec.serve.http.host, token, m, result, topology, spec.cache)
        else:
            app = build_model_app(spec, m, token)
        try:
            serve.run(app, name=m.name, route_prefix=None, blocking=False)
        except RuntimeError as err:
            raise ClusterError(f"model {m.name} failed to deploy: {err}") from None
    _deploy_warm_tier(spec)
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    try:
        handle = serve.run(build_front_door_app(spec, token, nodes), name=FRONT_DOOR_APP, route_prefix=None)
    except RuntimeError as err:
        raise ClusterError(f"the front door failed to start: {err}") from None
    with _closing(handle):
        url = _wait_serving(spec, handle, timeout_s=600)
    # What the next deploy compares against to roll only what changed (cluster/rolling_deploy.py).
    publish_deployed(DeployedRecord(spec_json=spec.model_dump_json(), internal_token=token,
                                    apps={m.name: m.name for m in spec.models}, at=time.time()))
    return {m.name: url for m in spec.models}


def _deploy_warm_tier(spec: ClusterSpec) -> None:
    """The warm-tier aggregator (deployments/control/warm_tier.py), when some model keeps a warm pool."""
    from ray import serve

    from hbmserve.deployments.apps.service_apps import build_warm_tier_app
    from hbmserve.deployments.control.warm_tier import wants_warm_tier

    if not wants_warm_tier(spec):
        return
    try:
        serve.run(build_warm_tier_app(spec), name=WARM_TIER_APP, route_prefix=None, blocking=False)
    except RuntimeError as err:
        raise ClusterError(f"the warm tier failed to start: {err}") from None


def _wait_serving(spec: ClusterSpec, handle, timeout_s: float) -> str:
    """Until the front door routes to every model whose replicas must be up (min_replicas > 0);
    returns its URL. A model whose deployment failed is a ClusterError with Serve's message."""
    from ray import serve

    from hbmserve.deployments.wire.records_store import read_ingress_info

    must = {m.name for m in spec.models if (m.replicas if m.autoscaling is None else m.autoscaling.min_replicas) > 0}
    deadline = time.monotonic() + timeout_s
    while True:
        info = read_ingress_info(handle.info.remote().result(timeout_s=30))
        waiting = must - {t.model for t in info.models if t.routable > 0}
        if not waiting:
            return info.url
        apps = serve.status().applications
        for name in waiting:
            app = apps.get(name)
            if app is not None and str(getattr(app.status, "value", app.status)) in ("DEPLOY_FAILED", "UNHEALTHY"):
                raise ClusterError(f"model {name} failed to deploy: {app.message}")
        if time.monotonic() > deadline:
            raise ClusterError(f"no replica of {', '.join(sorted(waiting))} is serving {timeout_s:g}s after the "
                               "deployment started (see `hbmserve status`)")
        time.sleep(0.3)


def _placement_plans(spec: ClusterSpec) -> dict:
    """model name -> (PlacementPlan, ClusterTopology) for every model the planner places
    (placed_app.plan_models: config order, each avoiding the GPUs of those before it).

    GPUs held by anything else in the live cluster are not known to the plan; Ray then cannot
    create the placement group and the replica stays pending (visible in `hbmserve status`).
    """
    if not any(spec.plans_placement(m) and m.replica_ceiling > 0 for m in spec.models):
        return {}
    from hbmserve.deployments.apps.placed_app import infeasible_message, plan_models
    from hbmserve.placement.cluster_file import TopologyFileError, load_cluster_file

    try:
        topology = load_cluster_file(spec.topology)
    except TopologyFileError as err:
        raise ClusterError(f"topology: {err}") from None
    plans = plan_models(spec, topology)
    for m in spec.models:
        if m.name in plans and not plans[m.name].feasible:
            raise ClusterError(f"cannot deploy: {infeasible_message(m, plans[m.name])}")
    return {name: (result, topology) for name, result in plans.items()}


# `hbmserve status --json` prints ModelStatus.to_dict(); tests/integration read its keys.
@dataclass(frozen=True)
class ReplicaStats(Record):
    replica: str  # node id prefix : pid
    url: str
    accepted: int  # requests admitted since the replica started
    rejected: int  # 429s
    in_flight: int
    role: ReplicaState = ReplicaState.ACTIVE  # or STANDBY: loaded, not routed to (autoscale/roles.py)
    # Planned replicas only: placement_verified and what crossed (placement/verification.py).
    placement: PlacementReport | None = None
    prompt_tokens: int = 0  # prefix cache since start: prompt tokens looked up
    prefix_hit_tokens: int = 0  # and found cached
    weights_cached: bool | None = None  # its weights were in the node's cache (None: no weights)
    weights_s: float | None = None  # seconds to make them local
    load_s: float | None = None  # seconds to a loaded engine, a fill from the source left out
    sleeping: bool = False  # a standby whose engine sleeps (vLLM sleep mode)
    wake_s: float | None = None  # its last wake, seconds (None: never woken)

    @classmethod
    def of(cls, key: str, info: ReplicaInfo) -> ReplicaStats:
        return cls(key, info.url, info.accepted, info.rejected, info.in_flight, info.role, info.placement,
                   info.prompt_tokens, info.prefix_hit_tokens, info.weights_cached, info.weights_s, info.load_s,
                   info.sleeping, info.wake_s)


@dataclass(frozen=True)
class ModelStatus(Record):
    name: str
    app_status: str
    replicas: dict[str, int]  # replica state -> count
    endpoints: tuple[str, ...]
    message: str
    replica_stats: tuple[ReplicaStats, ...] = ()  # the running replicas that answered
    # The autoscaling policy's last decision and reason; None with a fixed replica count.
    autoscale: DecisionRecord | None = None
    # What each front door saw of this model: admitted, refused, queued, replicas it reaches.
    traffic: tuple[ModelTraffic, ...] = ()
    # p95 TTFT/TPOT since the replicas started against the SLO; None without running replicas.
    latency: LatencyVsSlo | None = None
    roles: ReplicaRoles = ReplicaRoles()
    usd_per_hour: float | None = None  # the running replicas' GPUs; None: no replica reported a price


@contextlib.contextmanager
def _closing(handle):
    """Stop a handle's router when done: its metrics thread outlives `ray.shutdown()` otherwise,
    and its next push fails (or, with Ray's auto-connect on, starts a private local cluster)."""
    try:
        yield handle
    finally:
        handle.shutdown()


def _probe_replicas(handle, running: int, rounds: int = 5) -> dict[str, ReplicaInfo]:
    """Each running replica's `info()`, keyed by node:pid. A handle routes each call to some
    replica, the less busy of two; calls sent together spread out, so a few rounds find all."""
    from hbmserve.deployments.wire.records_store import read_replica_info

    seen: dict[str, ReplicaInfo] = {}
    for _ in range(rounds):
        for response in [handle.info.remote() for _ in range(min(2 * running, 64))]:
            info = read_replica_info(response.result(timeout_s=10))
            seen[f"{info.node_id[:8]}:{info.pid}"] = info
        if len(seen) >= running:
            break
    return seen


def status() -> list[ModelStatus]:
    """Every application's state; a malformed record read back is a ClusterError naming it."""
    try:
        return _status()
    except RecordError as err:
        raise ClusterError(str(err)) from None


def front_doors() -> list[IngressInfo]:
    """Every running front door's report (one per node), found by asking its deployment a few
    times: a handle picks a replica per call."""
    from ray import serve

    from hbmserve.deployments.wire.records_store import read_ingress_info

    app = serve.status().applications.get(FRONT_DOOR_APP)
    running = sum(d.replica_states.get("RUNNING", 0) for d in app.deployments.values()) if app else 0
    seen: dict[str, IngressInfo] = {}
    if running:
        with _closing(serve.get_deployment_handle(FRONT_DOOR_DEPLOYMENT, app_name=FRONT_DOOR_APP)) as handle:
            for _ in range(5):
                for response in [handle.info.remote() for _ in range(2 * running)]:
                    info = read_ingress_info(response.result(timeout_s=10))
                    seen[info.own_url] = info
                if len(seen) >= running:
                    break
    return [seen[k] for k in sorted(seen)]


def _status() -> list[ModelStatus]:
    import logging

    from ray import serve

    from hbmserve.deployments.wire.records_store import latest_decision

    # The handle's router warns each time a busy replica answers its queue-length probe late
    # (routinely, with tens of replicas on two cores); status only reads counters.
    logging.getLogger("ray.serve").setLevel(logging.ERROR)

    doors = front_doors()
    endpoints = tuple(sorted({d.url for d in doors}))
    out = []
    for name, app in serve.status().applications.items():
        if name in (FRONT_DOOR_APP, WARM_TIER_APP):  # no model: the front door, the warm tier
            continue
        replicas: dict[str, int] = {}
        seen: dict[str, ReplicaInfo] = {}
        # A planned model has a deployment per replica (deployments/apps/placed_app.py): probe each.
        for dep_name, dep in app.deployments.items():
            states = {str(getattr(state, "value", state)): n for state, n in dep.replica_states.items()}
            for state, n in states.items():
                replicas[state] = replicas.get(state, 0) + n
            if states.get("RUNNING", 0):
                with _closing(serve.get_deployment_handle(dep_name, app_name=name)) as handle:
                    seen |= _probe_replicas(handle, states["RUNNING"])
        stats = tuple(ReplicaStats.of(key, i) for key, i in sorted(seen.items()))
        # A planned, autoscaled model decides once for all its slot deployments, under the name
        # an unplanned model's engine deployment has.
        scopes = [engine_deployment_name(name), *app.deployments]
        decisions = [d for d in (latest_decision(name, dep) for dep in scopes) if d]
        model = name.partition("@")[0]  # a rollout's new version runs as `<model>@<n>` (cluster/rolling_deploy.py)
        traffic = tuple(t for d in doors for t in d.models if t.model == model)
        decision = decisions[0] if decisions else None
        infos = list(seen.values())
        out.append(ModelStatus(name, str(getattr(app.status, "value", app.status)), replicas, endpoints,
                               app.message, stats, decision, traffic, latency_vs_slo(infos),
                               status_roles(replicas, (i.role for i in infos), decision), usd_per_hour(infos)))
    return out


def warm_tier() -> WarmTierRecord | None:
    """What the warm-tier aggregator asked of the node autoscaler and prefetched; None when none
    runs. A malformed record is a ClusterError naming it."""
    from hbmserve.deployments.wire.records_store import latest_warm_tier

    try:
        return latest_warm_tier()
    except RecordError as err:
        raise ClusterError(str(err)) from None


def rollouts() -> list[RolloutRecord]:
    """Each model's last rollout (cluster/rolling_deploy.py), running or ended."""
    from hbmserve.deployments.wire.records_store import rollouts as read

    return read()


def metrics_targets() -> list[str]:
    """host:port of every live node's metrics endpoint (Ray's and hbmserve's own metrics, in
    Prometheus text format): what a Prometheus scrape config lists."""
    import ray

    return sorted(f"{n['NodeManagerAddress']}:{n['MetricsExportPort']}" for n in ray.nodes()
                  if n.get("Alive") and n.get("MetricsExportPort"))


def door_metrics_targets() -> list[str]:
    """host:port of each front door alone (its own port): Prometheus scrapes `/metrics` there
    with the admin token as a bearer token, one target per node (door_metrics.py)."""
    return sorted(d.own_url.removeprefix("http://") for d in front_doors())


def undeploy_all() -> None:
    from ray import serve

    from hbmserve.deployments.wire.records_store import forget_deployed

    forget_deployed()
    serve.shutdown()
