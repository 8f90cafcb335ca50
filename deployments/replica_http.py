"""What every engine server inside a replica shares: the model's shared port, an in-process
uvicorn listener, and the engine load gauges a replica reports.

Both `VLLMHttpServer` and `SimHttpServer` serve HTTP from the replica's own event loop (see
vllm_server.py for why no Serve proxy); this module keeps that plumbing in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass

# A replica being removed stops accepting connections at once (the kernel sends new ones to
# the model's other replicas on the shared port) and gets this long to finish in-flight
# requests; Serve's graceful_shutdown_timeout_s must exceed it (serve_app.py).
DRAIN_TIMEOUT_S = 25.0


@dataclass(frozen=True)
class EngineLoad:
    waiting: int
    running: int
    kv_usage: float  # 0..1


def bind_shared(host: str, port: int) -> socket.socket:
    """Bind with SO_REUSEPORT: every replica of a model on a host listens on the model's one
    port and the kernel spreads connections across them, so a rolling restart or a scale-up
    never moves the endpoint and needs no proxy hop."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise RuntimeError(f"cannot listen on {host}:{port}: {err}") from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


class AsgiListener:
    """uvicorn serving one ASGI app on an already-bound socket, on the running event loop."""

    def __init__(self) -> None:
        self._server = None
        self._task: asyncio.Task | None = None

    async def serve(self, asgi, host: str, port: int) -> str:
        """Bind the model's shared port and serve `asgi` on it; returns the URL. Call only once
        the engine is ready: binding is what puts the replica into the port's rotation."""
        import uvicorn

        sock = bind_shared(host, port)
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
        return f"http://{bound_host}:{bound_port}"

    async def stop(self, timeout_s: float = DRAIN_TIMEOUT_S + 2) -> None:
        """Drain: close the listening socket, let in-flight requests finish, then return."""
        if self._server is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, timeout=timeout_s)

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
