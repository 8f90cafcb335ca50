"""The front door's HTTP server: uvicorn (httptools) with the timeouts uvicorn lacks.

uvicorn calls the app only once a request's headers are complete, and has no timeout for
getting there: a client that opens a connection and trickles header bytes (slowloris) holds it
forever. `HardenedProtocol` arms a timer when a connection opens and whenever it starts a new
request, and answers 408 and closes if the headers are not complete in time. The body's own
timeout and size limit are the app's business (front_door_app.read_body), where the request is.
Idle keep-alive connections are closed by uvicorn's `timeout_keep_alive`; the connection cap is
uvicorn's `limit_concurrency` (503 past it).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True)
class HttpLimits:
    header_timeout_s: float = 10.0
    keep_alive_s: int = 5
    max_connections: int = 1024


class HardenedProtocol(HttpToolsProtocol):
    header_timeout_s = 10.0  # set per server by `protocol_for`

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def data_received(self, data: bytes) -> None:
        # Bytes between requests start the next request: its headers get the same deadline.
        if self.cycle is None or self.cycle.response_complete:
            self._arm()
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            body = b"request headers not received in time"
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\n"
                                 b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        self.transport.close()


def protocol_for(limits: HttpLimits) -> type[HardenedProtocol]:
    return type("FrontDoorProtocol", (HardenedProtocol,), {"header_timeout_s": limits.header_timeout_s})


def listen_socket(host: str, port: int, shared: bool) -> socket.socket:
    """A listening socket; `shared` sets SO_REUSEPORT so that several front doors on one host
    (a multi-node test cluster on one machine) serve the same public port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise RuntimeError(f"the front door cannot listen on {host}:{port}: {err}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class HardenedServer:
    """One uvicorn server on the running loop over the given sockets; Ray keeps the signals."""

    def __init__(self, asgi, limits: HttpLimits):
        import uvicorn

        config = uvicorn.Config(asgi, http=protocol_for(limits), log_level="warning", access_log=False,
                                timeout_keep_alive=limits.keep_alive_s, limit_concurrency=limits.max_connections,
                                timeout_graceful_shutdown=5, lifespan="off")

        class _Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                yield

        self._server = _Server(config)
        self._task: asyncio.Task | None = None

    async def start(self, sockets: list[socket.socket]) -> None:
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=sockets))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the front door's HTTP server exited before it started")
            await asyncio.sleep(0.02)

    @property
    def serving(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def connections(self) -> int:
        return len(self._server.server_state.connections)

    async def stop(self) -> None:
        if self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._task), timeout=10)
