"""Thin adapter to Ray: start/stop the local head, connect, deploy a ClusterSpec, read status."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hbmserve.core.config import ClusterSpec
from hbmserve.core.records import DecisionRecord, GateInfo, PlacementReport, Record, RecordError, ReplicaInfo
from hbmserve.core.scaling import ReplicaState

NAMESPACE = "hbmserve"
LOCAL_GCS_PORT = 6379


class ClusterError(RuntimeError):
    """A cluster operation failed in a way the user can act on; the message says how."""


def _ray_cli() -> str:
    exe = Path(sys.executable).with_name("ray")
    if not exe.exists():
        raise ClusterError("the `ray` command is missing from this environment: install hbmserve[cpu] or [gpu]")
    return str(exe)


def start_local_head(dashboard_port: int) -> str:
    """Start a Ray head on loopback (like `ray start --head`); returns its address."""
    cmd = [
        _ray_cli(), "start", "--head",
        "--node-ip-address", "127.0.0.1",
        "--port", str(LOCAL_GCS_PORT),
        "--dashboard-host", "127.0.0.1",
        "--dashboard-port", str(dashboard_port),
        "--disable-usage-stats",
    ]
    # Job drivers (`ray job submit -- hbmserve deploy ...`) inherit the head's PATH: put this
    # environment's scripts first so they find `hbmserve` without an activated venv.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-6:])
        raise ClusterError(f"`ray start --head` failed (is a cluster already running? try `hbmserve down`):\n{tail}")
    return f"127.0.0.1:{LOCAL_GCS_PORT}"


def stop_local_head() -> None:
    subprocess.run([_ray_cli(), "stop", "--force"], capture_output=True, text=True)


def _port_open(address: str) -> bool:
    """Probe a host:port with a plain socket: ray.init on a dead address retries for minutes."""
    import socket

    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return True  # not host:port (e.g. "auto" or ray://); let Ray resolve it
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=2):
            return True
    except OSError:
        return False


def local_head_running() -> bool:
    return _port_open(f"127.0.0.1:{LOCAL_GCS_PORT}")


def connect(address: str | None) -> str:
    """Connect this process to a cluster; `address` None means RAY_ADDRESS or the local head."""
    import ray

    addr = address or os.environ.get("RAY_ADDRESS") or f"127.0.0.1:{LOCAL_GCS_PORT}"
    if ray.is_initialized():
        return addr
    if not _port_open(addr.removeprefix("ray://")):
        raise ClusterError(f"no Ray cluster answers at {addr}. Start one with `hbmserve up`, or set RAY_ADDRESS.")
    try:
        ray.init(address=addr, namespace=NAMESPACE, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError) as err:
        raise ClusterError(f"cannot reach a Ray cluster at {addr}: {err}. Start one with `hbmserve up`, "
                           "or set RAY_ADDRESS.") from None
    return addr


def disconnect() -> None:
    import ray

    ray.shutdown()


def deploy(spec: ClusterSpec) -> dict[str, str]:
    """Deploy every model of `spec` as its own Serve application; waits until each serves.

    Returns model name -> endpoint URL.
    """
    from ray import serve

    from hbmserve.deployments.records_store import read_ingress_info
    from hbmserve.deployments.serve_app import build_model_app, model_ports, unsupported_engines

    problems = unsupported_engines(spec)
    if problems:
        raise ClusterError("cannot deploy:\n  " + "\n  ".join(problems))
    plans = _placement_plans(spec)  # before Serve starts: an infeasible plan deploys nothing
    # No Serve proxy: replicas serve HTTP themselves (deployments/vllm_server.py says why).
    serve.start(proxy_location="Disabled", http_options={"host": spec.serve.http.host})
    ports = model_ports(spec)
    endpoints = {}
    for m in spec.models:
        if m.name in plans:
            from hbmserve.deployments.placed_app import build_placed_app

            result, topology = plans[m.name]
            app = build_placed_app(spec.serve.http.host, spec.serve.auth, m, ports[m.name], result, topology)
        else:
            app = build_model_app(spec, m, ports[m.name])
        try:
            handle = serve.run(app, name=m.name, route_prefix=None)
        except RuntimeError as err:
            raise ClusterError(f"model {m.name} failed to deploy: {err}") from None
        with _closing(handle):
            try:
                endpoints[m.name] = read_ingress_info(handle.info.remote().result(timeout_s=60)).url
            except RecordError as err:
                raise ClusterError(f"model {m.name} deployed, but its ingress answered: {err}") from None
        # An autoscaled replica binds the port once the policy makes it active (one control
        # loop tick); the endpoint is returned when it answers.
        _wait_listening(endpoints[m.name], timeout_s=60)
    return endpoints


def _wait_listening(url: str, timeout_s: float) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = "127.0.0.1" if parts.hostname in ("0.0.0.0", "::") else parts.hostname
    deadline = time.monotonic() + timeout_s
    while not _port_open(f"{host}:{parts.port}"):
        if time.monotonic() > deadline:
            raise ClusterError(f"{url} is not listening {timeout_s:g}s after the deployment started")
        time.sleep(0.2)


def _placement_plans(spec: ClusterSpec) -> dict:
    """model name -> (PlacementPlan, ClusterTopology) for every model the planner places.

    Models are planned in config order on one topology, each avoiding the GPUs of those before
    it. GPUs held by anything else in the live cluster are not known to the plan; Ray then cannot
    create the placement group and the replica stays pending (visible in `hbmserve status`).
    """
    placed = [m for m in spec.models if spec.plans_placement(m) and m.replicas > 0]
    if not placed:
        return {}
    from hbmserve.deployments.placed_app import infeasible_message, plan_model
    from hbmserve.placement.cluster_file import TopologyFileError, load_cluster_file

    try:
        topology = load_cluster_file(spec.topology)
    except TopologyFileError as err:
        raise ClusterError(f"topology: {err}") from None
    plans, in_use = {}, frozenset()
    for m in placed:
        result = plan_model(m, topology, in_use)
        if not result.feasible:
            raise ClusterError(f"cannot deploy: {infeasible_message(m, result)}")
        plans[m.name] = (result, topology)
        in_use |= {g for r in result.replicas for g in r.members}
    return plans


# `hbmserve status --json` prints ModelStatus.to_dict(); tests/integration read its keys.
@dataclass(frozen=True)
class ReplicaStats(Record):
    replica: str  # node id prefix : pid
    url: str
    accepted: int  # requests admitted since the replica started
    rejected: int  # 429s
    in_flight: int
    role: ReplicaState = ReplicaState.ACTIVE  # or STANDBY: loaded, out of rotation (autoscale/roles.py)
    # Planned replicas only: placement_verified and what crossed (placement/verification.py).
    placement: PlacementReport | None = None

    @classmethod
    def of(cls, key: str, info: ReplicaInfo) -> ReplicaStats:
        return cls(key, info.url, info.accepted, info.rejected, info.in_flight, info.role, info.placement)


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
    # A scale-to-zero model's gate (deployments/gate.py): listening, held requests.
    gate: GateInfo | None = None


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
    from hbmserve.deployments.records_store import read_replica_info

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


def _status() -> list[ModelStatus]:
    import logging

    from ray import serve

    from hbmserve.deployments.records_store import latest_decision, read_gate_info

    # The handle's router warns each time a busy replica answers its queue-length probe late
    # (routinely, with tens of replicas on two cores); status only reads counters.
    logging.getLogger("ray.serve").setLevel(logging.ERROR)

    out = []
    for name, app in serve.status().applications.items():
        replicas: dict[str, int] = {}
        seen: dict[str, ReplicaInfo] = {}
        gate: GateInfo | None = None
        # A planned model has a deployment per replica (deployments/placed_app.py): probe each.
        for dep_name, dep in app.deployments.items():
            states = {str(getattr(state, "value", state)): n for state, n in dep.replica_states.items()}
            if dep_name.startswith("gate-"):
                if states.get("RUNNING", 0):
                    with _closing(serve.get_deployment_handle(dep_name, app_name=name)) as handle:
                        gate = read_gate_info(handle.info.remote().result(timeout_s=10))
                continue
            for state, n in states.items():
                replicas[state] = replicas.get(state, 0) + n
            if states.get("RUNNING", 0):
                with _closing(serve.get_deployment_handle(dep_name, app_name=name)) as handle:
                    seen |= _probe_replicas(handle, states["RUNNING"])
        stats = tuple(ReplicaStats.of(key, i) for key, i in sorted(seen.items()))
        decisions = [d for d in (latest_decision(name, dep) for dep in app.deployments) if d]
        out.append(ModelStatus(name, str(getattr(app.status, "value", app.status)), replicas,
                               tuple(sorted({s.url for s in stats} | ({gate.url} if gate else set()))),
                               app.message, stats,
                               decisions[0] if decisions else None, gate))
    return out


def metrics_targets() -> list[str]:
    """host:port of every live node's metrics endpoint (Ray's and hbmserve's own metrics, in
    Prometheus text format): what a Prometheus scrape config lists."""
    import ray

    return sorted(f"{n['NodeManagerAddress']}:{n['MetricsExportPort']}" for n in ray.nodes()
                  if n.get("Alive") and n.get("MetricsExportPort"))


def undeploy_all() -> None:
    from ray import serve

    serve.shutdown()
