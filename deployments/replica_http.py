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
    # Counters since start: prompt tokens looked up in the prefix cache, and those found there
    # (vLLM's prefix_cache_queries and prefix_cache_hits); hit rate = hits / prompt tokens.
    prompt_tokens: int = 0
    prefix_hit_tokens: int = 0


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
    """uvicorn serving one ASGI app on the model's shared port, on the running event loop.

    `pause()` takes the replica out of the port's rotation (a hot standby, or a replica being
    demoted) while its in-flight requests finish; `resume()` puts it back. Each `serve` or
    `resume` binds a fresh socket with its own uvicorn server; paused ones drain in the
    background and `stop()` waits for them.
    """

    def __init__(self) -> None:
        self._server = None
        self._task: asyncio.Task | None = None
        self._draining: set[asyncio.Task] = set()
        self._target: tuple | None = None  # (asgi, host, port) of the last serve()
        # This replica alone, on an ephemeral port: where a model's gate forwards the requests
        # it held (forwarding to the shared port could land on the gate itself).
        self.private_url: str | None = None

    def prepare(self, asgi, host: str, port: int) -> str:
        """Remember what to serve, without binding (a replica that starts as a standby)."""
        self._target = (asgi, host, port)
        return f"http://{host}:{port}"

    async def serve(self, asgi, host: str, port: int) -> str:
        """Bind the model's shared port and serve `asgi` on it; returns the URL. Call only once
        the engine is ready: binding is what puts the replica into the port's rotation."""
        import uvicorn

        self.prepare(asgi, host, port)
        sock = bind_shared(host, port)
        private = socket.create_server((host, 0), backlog=1024)
        private.setblocking(False)
        config = uvicorn.Config(asgi, log_level="warning", access_log=False, timeout_keep_alive=30,
                                timeout_graceful_shutdown=DRAIN_TIMEOUT_S)
        self._server = _no_signal_server(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock, private]))
        try:
            while not self._server.started:
                if self._task.done():
                    self._task.result()
                    raise RuntimeError("the HTTP server exited before it started serving")
                await asyncio.sleep(0.05)
        except BaseException:
            sock.close()
            private.close()
            raise
        self.private_url = "http://{}:{}".format(*private.getsockname()[:2])
        bound_host, bound_port = sock.getsockname()[:2]
        return f"http://{bound_host}:{bound_port}"

    def pause(self) -> None:
        """Stop accepting connections now; in-flight requests finish in the background."""
        if self.serving:
            self._server.should_exit = True
            self._draining.add(self._task)
            self._task.add_done_callback(self._draining.discard)
        self._server, self._task, self.private_url = None, None, None

    async def resume(self) -> None:
        if not self.serving and self._target is not None:
            await self.serve(*self._target)

    async def stop(self, timeout_s: float = DRAIN_TIMEOUT_S + 2) -> None:
        """Drain: close the listening socket, let in-flight requests finish, then return."""
        self.pause()
        self._target = None  # stopped for good: not ready, and resume() does nothing
        if self._draining:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.gather(*self._draining, return_exceptions=True), timeout=timeout_s)

    @property
    def serving(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def ready(self) -> bool:
        """Serving, or paused on purpose (a standby): what a health check may accept."""
        return self.serving or (self._task is None and self._target is not None)


def _no_signal_server(config):
    """uvicorn.Server that leaves signal handling to Ray: the replica is not the main program."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return Server(config)
