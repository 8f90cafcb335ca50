"""What every engine server inside a replica shares: an in-process uvicorn listener on a private
port, and the engine load gauges a replica reports.

Both `VLLMHttpServer` and `SimHttpServer` serve HTTP from the replica's own event loop (see
vllm_server.py for why no Serve proxy). A replica listens on an ephemeral port of its node; only
the front door (deployments/ingress/front_door.py) connects to it, with the deployment's internal token. Which
replicas get traffic (active, standby, draining) is the front door's routing decision, so a
replica never opens or closes its socket on a role change.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from hbmserve.deployments.wire.http_limits import HttpLimits

# A replica being removed is dropped from the front door's routing table within a discovery
# poll and gets this long to finish in-flight requests; Serve's graceful_shutdown_timeout_s must
# exceed it (engine_replica.py).
DRAIN_TIMEOUT_S = 25.0


@dataclass(frozen=True)
class EngineLoad:
    waiting: int
    running: int
    kv_usage: float  # 0..1
    # Counters since start: prompt tokens looked up in the prefix cache, and those found there
    # (vLLM's prefix_cache_queries and prefix_cache_hits); hit rate = hits / prompt tokens.
    prompt_tokens: int = 0
    prefix_hit_tokens: int = 0


# The replica's listener: the front door's hardened protocol (deployments/wire/hardened_http.py), so a
# client that reaches a replica port directly meets the same header deadline, idle-socket
# timeout and header caps. No request or per-address cap here: front doors are its only
# clients, each through a pool of keep-alive sockets, and the replica cap bounds what runs.
REPLICA_HTTP_LIMITS = HttpLimits(keep_alive_s=30, max_in_flight=None, max_connections_per_client=None)


class AsgiListener:
    """A hardened uvicorn server for one ASGI app on an ephemeral port of `host`, on the running
    event loop."""

    def __init__(self) -> None:
        self._server = None  # a wire.hardened_http.HardenedServer once serving
        self.url: str | None = None

    async def serve(self, asgi, host: str) -> str:
        """Bind an ephemeral port and serve `asgi` on it; returns the URL. Call only once the
        engine is ready: the front door routes to a replica as soon as it announces its URL."""
        from hbmserve.deployments.wire.hardened_http import HardenedServer  # uvicorn: imported when serving

        sock = socket.create_server((host, 0), backlog=1024)
        sock.setblocking(False)
        # lifespan "auto": vLLM's app may run start-up hooks; the front door's needs none.
        server = HardenedServer(asgi, REPLICA_HTTP_LIMITS, graceful_shutdown_s=DRAIN_TIMEOUT_S, lifespan="auto")
        try:
            await server.start([sock])
        except BaseException:
            sock.close()
            raise
        self._server = server
        bound_host, bound_port = sock.getsockname()[:2]
        self.url = f"http://{bound_host}:{bound_port}"
        return self.url

    async def stop(self, timeout_s: float = DRAIN_TIMEOUT_S + 2) -> None:
        """Drain: close the listening socket, let in-flight requests finish, then return."""
        if self._server is None:
            return
        await self._server.stop(timeout_s)
        self._server = None

    @property
    def serving(self) -> bool:
        return self._server is not None and self._server.serving
