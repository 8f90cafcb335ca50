"""What every engine server inside a replica shares: an in-process uvicorn listener on a private
port, and the engine load gauges a replica reports.

Both `VLLMHttpServer` and `SimHttpServer` serve HTTP from the replica's own event loop (see
vllm_server.py for why no Serve proxy). A replica listens on an ephemeral port of its node; only
the front door (front_door.py) connects to it, with the deployment's internal token. Which
replicas get traffic (active, standby, draining) is the front door's routing decision, so a
replica never opens or closes its socket on a role change.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass

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


class AsgiListener:
    """uvicorn serving one ASGI app on an ephemeral port of `host`, on the running event loop."""

    def __init__(self) -> None:
        self._server = None
        self._task: asyncio.Task | None = None
        self.url: str | None = None

    async def serve(self, asgi, host: str) -> str:
        """Bind an ephemeral port and serve `asgi` on it; returns the URL. Call only once the
        engine is ready: the front door routes to a replica as soon as it announces its URL."""
        import uvicorn

        sock = socket.create_server((host, 0), backlog=1024)
        sock.setblocking(False)
        config = uvicorn.Config(asgi, log_level="warning", access_log=False, timeout_keep_alive=30,
                                timeout_graceful_shutdown=DRAIN_TIMEOUT_S)
        self._server = _no_signal_server(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        try:
            while not self._server.started:
                if self._task.done():
                    self._task.result()
                    raise RuntimeError("the HTTP server exited before it started serving")
                await asyncio.sleep(0.05)
        except BaseException:
            sock.close()
            raise
        bound_host, bound_port = sock.getsockname()[:2]
        self.url = f"http://{bound_host}:{bound_port}"
        return self.url

    async def stop(self, timeout_s: float = DRAIN_TIMEOUT_S + 2) -> None:
        """Drain: close the listening socket, let in-flight requests finish, then return."""
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._task), timeout=timeout_s)
        self._task = None

    @property
    def serving(self) -> bool:
        return self._task is not None and not self._task.done()


def _no_signal_server(config):
    """uvicorn.Server that leaves signal handling to Ray: the replica is not the main program."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return Server(config)
