"""Thin adapter to Ray: start/stop the local head, connect, deploy a ClusterSpec, read status."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hbmserve.cluster.config import ClusterSpec

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

    from hbmserve.deployments.serve_app import build_model_app, model_ports, unsupported_engines

    problems = unsupported_engines(spec)
    if problems:
        raise ClusterError("cannot deploy:\n  " + "\n  ".join(problems))
    # No Serve proxy: replicas serve HTTP themselves (deployments/vllm_server.py says why).
    serve.start(proxy_location="Disabled", http_options={"host": spec.serve.http.host})
    ports = model_ports(spec)
    endpoints = {}
    for m in spec.models:
        try:
            handle = serve.run(build_model_app(spec, m, ports[m.name]), name=m.name, route_prefix=None)
        except RuntimeError as err:
            raise ClusterError(f"model {m.name} failed to deploy: {err}") from None
        endpoints[m.name] = handle.info.remote().result(timeout_s=60)["url"]
    return endpoints


@dataclass(frozen=True)
class ReplicaStats:
    replica: str  # node id prefix : pid
    url: str
    accepted: int  # requests admitted since the replica started
    rejected: int  # 429s
    in_flight: int


@dataclass(frozen=True)
class ModelStatus:
    name: str
    app_status: str
    replicas: dict[str, int]  # replica state -> count
    endpoints: tuple[str, ...]
    message: str
    replica_stats: tuple[ReplicaStats, ...] = ()  # the running replicas that answered


def _probe_replicas(handle, running: int, rounds: int = 5) -> dict[str, dict]:
    """Each running replica's `info()`, keyed by node:pid. A handle routes each call to some
    replica, the less busy of two; calls sent together spread out, so a few rounds find all."""
    seen: dict[str, dict] = {}
    for _ in range(rounds):
        for response in [handle.info.remote() for _ in range(2 * running)]:
            info = response.result(timeout_s=10)
            seen[f"{info['node_id'][:8]}:{info['pid']}"] = info
        if len(seen) >= running:
            break
    return seen


def status() -> list[ModelStatus]:
    from ray import serve

    out = []
    for name, app in serve.status().applications.items():
        replicas: dict[str, int] = {}
        for dep in app.deployments.values():
            for state, n in dep.replica_states.items():
                replicas[str(getattr(state, "value", state))] = replicas.get(str(getattr(state, "value", state)), 0) + n
        running = replicas.get("RUNNING", 0)
        seen = _probe_replicas(serve.get_app_handle(name), running) if running else {}
        stats = tuple(ReplicaStats(key, i["url"], i["accepted"], i["rejected"], i["in_flight"])
                      for key, i in sorted(seen.items()))
        out.append(ModelStatus(name, str(getattr(app.status, "value", app.status)), replicas,
                               tuple(sorted({s.url for s in stats})), app.message, stats))
    return out


def undeploy_all() -> None:
    from ray import serve

    serve.shutdown()
