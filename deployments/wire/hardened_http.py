"""The HTTP listener of every hbmserve socket, the front door's and each replica's: uvicorn
(httptools) with the limits uvicorn lacks.

uvicorn calls the app only once a request's headers are complete, and bounds neither the time
nor the bytes spent getting there. `HardenedProtocol` adds, per connection:
* a deadline for a connection that has sent no byte at all (`idle_connection_s`, ~2 s): a silent
  socket is closed, not kept;
* a deadline for each request's headers (`header_timeout_s`), armed when the connection opens
  and whenever a new request starts: 408 and close (slowloris);
* a cap on the header bytes (`max_header_bytes`, 64 KiB) and on the header count
  (`max_headers`): 431 and close, before httptools buffers more of a header flood.
* a cap on the sockets one client address holds open (`max_connections_per_client`; trusted
  proxies apart). A socket past it is on probation: it holds no place, must send its headers
  within PROBATION_S, and may ask only for a probe path (`/health`, `/metrics`), once; anything
  else gets 429 and the close. A kubelet or a load balancer probes from an address that may
  also carry traffic (a node, a NAT): its probe is answered even while that address is full,
  and a socket past the cap lives no longer than a refused one did (the lingering close).
Each request's scope offers a `ChunkPush` (wire/chunk_push.py) for relaying a stream's body.
The body's own timeout and size limit are the app's business (deployments/ingress/front_door_app.py
`read_body`), where the request is. Idle keep-alive connections are closed by uvicorn's
`timeout_keep_alive`.

There is no cap on open sockets as such: uvicorn's `limit_concurrency` counted sockets that had
sent nothing, so silent sockets filled it and `/health` answered 503. `InFlightCap` caps
requests instead, and never the probe paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import Counter
from typing import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hbmserve.deployments.wire.chunk_push import PUSH_EXTENSION, ChunkPush
from hbmserve.deployments.wire.http import openai_error
from hbmserve.deployments.wire.http_limits import (LINGER_S, OVERLOAD_RETRY_AFTER_S, PROBATION_S, PROBE_PATHS,
                                                   HttpLimits)


class HardenedProtocol(HttpToolsProtocol):
    limits = HttpLimits()  # set per server by `protocol_for`
    open_per_client: Counter[str] = Counter()  # per server too: address -> open sockets it holds
    on_refused: Callable[[str], None] | None = None  # per server: told the code of each cap's refusal

    def connection_made(self, transport) -> None:  # type: ignore[override]
        # asyncio sets TCP_NODELAY only on sockets made with IPPROTO_TCP, and `listen_socket`'s are
        # not; uvloop sets it on every one. Without it, on asyncio's loop, a reply's later pieces
        # waited for the client's delayed ACK: a two-piece stream took 44 ms instead of 1.1.
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._awaiting_headers = True
        self._header_bytes = self._header_count = 0
        self._refused = False
        self._silent_timer: asyncio.TimerHandle | None = None
        self._probation = False
        self._counted_as = self.client[0] if self.client and self.limits.caps_client(self.client[0]) else None
        if self._counted_as is not None:
            if self.open_per_client[self._counted_as] >= self.limits.max_connections_per_client:
                self._counted_as = None  # a socket on probation holds no place
                self._probation = True
                self._header_timer = self.loop.call_later(PROBATION_S, self._over_the_cap, False)
                return
            self.open_per_client[self._counted_as] += 1
        self._silent_timer = self.loop.call_later(self.limits.idle_connection_s, self._silent_too_long)
        self._arm()

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        for timer in (self._header_timer, self._silent_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._silent_timer = None

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # a refused flood: read and dropped until the lingering close
        if self._silent_timer is not None:
            self._silent_timer.cancel()
            self._silent_timer = None
        # Bytes between requests start the next request: its headers get the same deadline and caps.
        if self.cycle is None or self.cycle.response_complete:
            if not self._awaiting_headers:
                self._awaiting_headers, self._header_bytes, self._header_count = True, 0, 0
            self._arm()
        waiting = self._awaiting_headers
        super().data_received(data)
        # Counted only while the headers are still incomplete after the chunk, so a body that
        # arrives in the same read as its headers is not counted as header bytes.
        if waiting and self._awaiting_headers and not self._refused and not self.transport.is_closing():
            self._header_bytes += len(data)
            if self._header_bytes > self.limits.max_header_bytes:
                self._refuse(431, b"request headers too large")

    def on_header(self, name: bytes, value: bytes) -> None:  # type: ignore[override]
        self._header_count += 1
        if self._header_count <= self.limits.max_headers:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._awaiting_headers = False
        if self._header_count > self.limits.max_headers:
            self._refuse(431, b"too many request headers")
            return
        if self._probation and self.url.split(b"?", 1)[0].decode("latin-1") not in PROBE_PATHS:
            self._over_the_cap(True)
            return
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.scope is self.scope:  # a request's own cycle (not an upgrade)
            self.scope.setdefault("extensions", {})[PUSH_EXTENSION] = ChunkPush(self.cycle)
        if self._probation:
            self.cycle.keep_alive = False  # one probe, then the close

    # The parser goes on through the rest of a chunk after a refusal: nothing of it reaches the app.
    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self._counted_as is not None:
            self.open_per_client[self._counted_as] -= 1
            if not self.open_per_client[self._counted_as]:
                del self.open_per_client[self._counted_as]
        super().connection_lost(exc)

    def _over_the_cap(self, linger: bool) -> None:
        """A socket past its address's cap that asked for more than a probe, or nothing in time.
        Without a request there is nothing unread to reset the answer: no linger then."""
        self._header_timer = None
        if self.transport.is_closing():
            return
        self._refuse(429, b"too many connections from this address", linger=linger)
        if self.on_refused is not None:
            self.on_refused("too_many_connections")

    def _silent_too_long(self) -> None:
        """A connection that sent nothing: closed without a reply (there is no request to answer)."""
        self._silent_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            # A slow client has little unread: answered and closed at once (no linger).
            self._refuse(408, b"request headers not received in time", linger=False)
        else:
            self.transport.close()

    def _refuse(self, status: int, body: bytes, linger: bool = True) -> None:
        """Answer and close. The close lingers: closing a socket with unread bytes (a flood keeps
        sending) resets it, and the reset can destroy the answer before the client reads it; so
        the reply is followed by a FIN, what still arrives is dropped unparsed, and the socket
        closes LINGER_S later."""
        reason = {408: b"Request Timeout", 429: b"Too Many Requests", 431: b"Request Header Fields Too Large"}[status]
        self._disarm()
        self._refused = True
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n%s" % (status, reason, len(body), body))
        if not linger:
            self.transport.close()
            return
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


def protocol_for(limits: HttpLimits, on_refused: Callable[[str], None] | None = None) -> type[HardenedProtocol]:
    return type("HardenedHttp", (HardenedProtocol,),
                {"limits": limits, "open_per_client": Counter(), "on_refused": staticmethod(on_refused)})


class InFlightCap:
    """ASGI wrapper: at most `cap` requests handled at once; past it, 429 + Retry-After in
    OpenAI's error shape. The probe paths are always handled, so a full door stays ready."""

    def __init__(self, app, cap: int | None, on_refused: Callable[[str], None] | None = None):
        self.app, self.cap, self.in_flight, self.on_refused = app, cap, 0, on_refused

    async def __call__(self, scope, receive, send) -> None:
        if self.cap is None or scope["type"] != "http" or scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.cap:
            if self.on_refused is not None:
                self.on_refused("server_busy")
            for msg in openai_error(429, f"this server is handling its limit of {self.cap} requests at once; "
                                    "retry shortly", "rate_limit_error", "server_busy",
                                    [(b"retry-after", str(OVERLOAD_RETRY_AFTER_S).encode())]):
                await send(msg)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


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
        raise RuntimeError(f"cannot listen on {host}:{port}: {err}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class HardenedServer:
    """One uvicorn server on the running loop over the given sockets; Ray keeps the signals.
    `on_refused(code)` hears each refusal of a cap ("server_busy", "too_many_connections")."""

    def __init__(self, asgi, limits: HttpLimits, graceful_shutdown_s: float = 5.0, lifespan: str = "off",
                 on_refused: Callable[[str], None] | None = None):
        import uvicorn

        self.cap = InFlightCap(asgi, limits.max_in_flight, on_refused)
        # log_config=None: uvicorn's default runs logging.config.dictConfig, which closes every
        # handler of the process, Serve's replica logger included; Serve's recovering controller
        # then fails the replica's is_allocated() on the closed handler and stops every replica
        # (a controller restart under load lost requests and the whole fleet).
        # proxy_headers=False: nothing here reads the client's address from the scope (the caps
        # take it from the socket), so uvicorn's X-Forwarded-For layer was a cost on every request;
        # server_header=False: no software name handed to whoever asks.
        config = uvicorn.Config(self.cap, http=protocol_for(limits, on_refused), log_level="warning",
                                log_config=None, access_log=False, timeout_keep_alive=limits.keep_alive_s,
                                timeout_graceful_shutdown=graceful_shutdown_s, lifespan=lifespan,
                                proxy_headers=False, server_header=False)

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
                raise RuntimeError("the HTTP server exited before it started")
            await asyncio.sleep(0.02)

    @property
    def serving(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def connections(self) -> int:
        return len(self._server.server_state.connections)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Close the listening sockets, let in-flight requests finish (up to `timeout_s`)."""
        if self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._task), timeout=timeout_s)
