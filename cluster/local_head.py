"""The local Ray head `hbmserve up` starts and stops: token auth on (cluster/ray_auth.py), on
loopback unless the config says otherwise, and what a client of it needs in its environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hbmserve.cluster import ray_auth

LOCAL_GCS_PORT = 6379
# Ray starts its workers, and so every Serve replica (the front door, the engine replica, vLLM's
# engine core and CPU worker), at nice 15, below Ray's own daemons and anything else on the node.
# On a serving node the data path is the work: at c=16 on 2 cores, in 5 interleaved rounds,
# nice 0 served more in 4 of 5 (median 2,045 vs 1,787 tok/s, TPOT p50 6.2 vs 6.9 ms;
# docs/benchmarks.md). A value the user set is kept. The Helm chart sets the same on every Ray
# container (`hbmserve.rayEnv`).
SERVING_ENV = {"RAY_worker_niceness": "0"}


class ClusterError(RuntimeError):
    """A cluster operation failed in a way the user can act on; the message says how."""


def _ray_cli() -> str:
    exe = Path(sys.executable).with_name("ray")
    if not exe.exists():
        raise ClusterError("the `ray` command is missing from this environment: install hbmserve[cpu] or [gpu]")
    return str(exe)


def start_local_head(dashboard_port: int, host: str = "127.0.0.1") -> str:
    """Start a Ray head (like `ray start --head`) with Ray's token authentication on
    (cluster/ray_auth.py), listening on `host` alone when it is loopback; returns its address."""
    from hbmserve.cluster.checks import is_loopback

    cmd = [
        _ray_cli(), "start", "--head",
        "--node-ip-address", host,
        "--port", str(LOCAL_GCS_PORT),
        "--dashboard-host", host,
        "--dashboard-port", str(dashboard_port),
        "--disable-usage-stats",
    ]
    single_machine = ray_auth.LOOPBACK_ENV if is_loopback(host) else {}  # ray_auth.py says why
    # Job drivers (`ray job submit -- hbmserve deploy ...`) inherit the head's PATH: put this
    # environment's scripts first so they find `hbmserve` without an activated venv.
    env = {**SERVING_ENV, **os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           **ray_auth.head_env(), **single_machine}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-6:])
        raise ClusterError(f"`ray start --head` failed (is a cluster already running? try `hbmserve down`):\n{tail}")
    return f"127.0.0.1:{LOCAL_GCS_PORT}"


def stop_local_head() -> None:
    subprocess.run([_ray_cli(), "stop", "--force"], capture_output=True, text=True)


def port_open(address: str) -> bool:
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
    return port_open(f"127.0.0.1:{LOCAL_GCS_PORT}")


def outward_address() -> str | None:
    """This machine's address toward the network (what another machine reaches), or None."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.250", 9))  # sends nothing: picks the route's source address
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def loopback_head() -> bool:
    """Whether the local head runs and listens on loopback alone (its GCS port is closed on the
    machine's outward address)."""
    outside = outward_address()
    return local_head_running() and (outside is None or not port_open(f"{outside}:{LOCAL_GCS_PORT}"))


def local_head_env() -> dict[str, str]:
    """What a client of the local head needs in its environment (cluster/ray_auth.py)."""
    return ray_auth.client_env() | (ray_auth.LOOPBACK_ENV if loopback_head() else {})
