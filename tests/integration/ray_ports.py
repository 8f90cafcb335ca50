"""What a stranger on the network meets on this machine's listening ports: every TCP listener,
and per port, whether it takes a Ray call without a token. A gRPC call is made the way any Ray
client makes one (a GCS method, no authorization metadata); an HTTP GET asks the dashboard's job
API. A port "accepts" when the call is served or fails for a reason other than authentication."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

import grpc
import httpx

LOOPBACK = ("127.", "[::ffff:127.", "[::1]", "::1", "localhost")


@dataclass(frozen=True)
class Listener:
    address: str  # host:port as `ss` prints it
    process: str

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    @property
    def loopback_only(self) -> bool:
        return self.address.startswith(LOOPBACK)


def listeners() -> set[Listener]:
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        proc = re.search(r'\(\("([^"]+)"', line)
        found.add(Listener(line.split()[3], proc.group(1) if proc else "?"))
    return found


# A real method of each gRPC service a Ray node or a Serve replica serves: a server that checks
# tokens refuses each with UNAUTHENTICATED; one that serves a method without a token answers it
# (or fails on the empty request, which means the method ran).
RAY_METHODS = ("/ray.rpc.NodeInfoGcsService/GetAllNodeInfo", "/ray.rpc.NodeManagerService/GetNodeStats",
               "/ray.rpc.CoreWorkerService/NumPendingTasks", "/ray.serve.ASGIService/HandleRequest")
NOT_SERVED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE,
              grpc.StatusCode.DEADLINE_EXCEEDED)


def grpc_verdict(host: str, port: int) -> str:
    """"unauthenticated" when the port is a gRPC server that refused every probed method for
    want of a token, "refused" when nothing gRPC answered them, else what a method returned."""
    codes = []
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        for method in RAY_METHODS:
            try:
                channel.unary_unary(method)(b"", timeout=3)
                return f"OK {method}"
            except grpc.RpcError as err:
                if err.code() not in NOT_SERVED:
                    return f"{err.code().name} {method}"
                codes.append(err.code())
    return "unauthenticated" if grpc.StatusCode.UNAUTHENTICATED in codes else "refused"


def http_verdict(host: str, port: int) -> str:
    try:
        r = httpx.get(f"http://{host}:{port}/api/jobs/", timeout=3)
    except httpx.HTTPError:
        return "refused"
    return "unauthenticated" if r.status_code in (401, 403) else str(r.status_code)


def accepts_unauthenticated(host: str, port: int) -> str | None:
    """What a token-less Ray call got at host:port when it was not refused for want of a
    token (None when it was refused, or nothing answered)."""
    for verdict in (grpc_verdict(host, port), http_verdict(host, port)):
        if verdict not in ("refused", "unauthenticated", "404"):
            return verdict
    return None
