"""The floor under any front door written in Python (issue 22, requirement 3): an HTTP/1.1 relay
that decides nothing and reads nothing it does not have to.

It takes each request whole from the client (head and Content-Length body), sends it unchanged
over a pooled keep-alive connection to one replica, and writes every piece of the reply to the
client as it arrives, following the chunked framing only to know where the reply ends so the
connection can go back to the pool. No JSON, no admission, no routing, no ledger, no usage tap,
no timing, no flow control: what is left is the loop, the sockets and the framing, the part of
the door's cost that no rewrite of its features can remove. `door_cpu --sides door pyrelay`
runs it beside the door, on the same loop, in front of the same simulated replica.

`asgi_relay` is the step between the two: the door's own listener (HardenedServer: uvicorn's
HTTP parser and ASGI cycle, the caps) and its own relay (relay.py over wire/upstream.py, with
the push), deciding nothing: no JSON, admission, routing, ledger or usage tap. Door minus it is
what the features cost; it minus the bare relay is what the listener and the relay's layers cost.

A benchmark's instrument, not a product part: it trusts its client and its replica.
"""

from __future__ import annotations

import asyncio


class Upstream(asyncio.Protocol):
    """One keep-alive connection to the replica, lent to one client's request at a time."""

    def __init__(self, relay: PyRelay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.client: Client | None = None
        self.head: bytes | None = b""  # None once the reply's head has passed
        self.left = 0  # body bytes still to pass (a chunk's data and its CRLF, or a sized body)
        self.chunked = False
        self.last = False  # the zero-size chunk is seen; only its CRLF is left
        self.carry = b""  # a chunk-size line split across reads

    def connection_made(self, transport) -> None:
        self.transport = transport

    def start(self, client: Client, request: bytes) -> None:
        self.client, self.head, self.carry, self.left, self.last = client, b"", b"", 0, False
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        client = self.client
        client.transport.write(data)
        if self._ended(data):
            self.client = None
            self.relay.pool.append(self)
            client.reply_done()

    def connection_lost(self, exc) -> None:
        if self in self.relay.pool:
            self.relay.pool.remove(self)
        if self.client is not None:
            self.client.transport.close()

    def _ended(self, data: bytes) -> bool:
        pos = 0
        if self.head is not None:  # still in the reply's head
            self.head += data
            i = self.head.find(b"\r\n\r\n")
            if i < 0:
                return False
            head = self.head[:i].lower()
            self.chunked = b"transfer-encoding: chunked" in head
            if not self.chunked:
                j = head.find(b"content-length:")
                self.left = int(head[j + 15:].split(b"\r\n", 1)[0]) if j >= 0 else 0
            data, pos, self.head = self.head, i + 4, None
        if not self.chunked:
            self.left -= len(data) - pos
            return self.left <= 0
        return self._chunks(data, pos)

    def _chunks(self, data: bytes, pos: int) -> bool:
        if self.carry:
            data, pos, self.carry = self.carry + data[pos:], 0, b""
        n = len(data)
        while pos < n:
            if self.left:
                take = min(self.left, n - pos)
                self.left -= take
                pos += take
                if self.last and not self.left:
                    return True
                continue
            i = data.find(b"\r\n", pos)
            if i < 0:
                self.carry = data[pos:]
                return False
            size = int(data[pos:i].split(b";", 1)[0], 16)
            pos = i + 2
            self.left, self.last = size + 2, size == 0
        return False


class Client(asyncio.Protocol):
    """One client connection: a request at a time, as HTTP/1.1 without pipelining sends them."""

    def __init__(self, relay: PyRelay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.buf = b""

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        i = self.buf.find(b"\r\n\r\n")
        if i < 0:
            return
        head = self.buf[:i].lower()
        j = head.find(b"content-length:")
        size = int(head[j + 15:].split(b"\r\n", 1)[0]) if j >= 0 else 0
        if len(self.buf) < i + 4 + size:
            return
        request, self.buf = self.buf[:i + 4 + size], self.buf[i + 4 + size:]
        self.transport.pause_reading()  # the next request waits for this reply's end
        if self.relay.pool:
            self.relay.pool.pop().start(self, request)
        else:
            asyncio.ensure_future(self.relay.connect()).add_done_callback(
                lambda f: f.result().start(self, request))

    def reply_done(self) -> None:
        self.transport.resume_reading()
        if self.buf:
            self.data_received(b"")


class PyRelay:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.pool: list[Upstream] = []
        self.server: asyncio.Server | None = None

    async def connect(self) -> Upstream:
        _, upstream = await asyncio.get_running_loop().create_connection(
            lambda: Upstream(self), self.host, self.port)
        return upstream

    async def serve(self, listen_host: str = "127.0.0.1") -> str:
        self.server = await asyncio.get_running_loop().create_server(lambda: Client(self), listen_host, 0)
        return f"http://{listen_host}:{self.server.sockets[0].getsockname()[1]}"


def asgi_relay(url: str, token: str):
    """An ASGI app that sends each request, as read, to the replica at `url` (whose internal
    token is `token`) through the door's relay and pool, and streams the reply back with the
    listener's push."""
    from hbmserve.deployments.ingress.relay import relay, upstream_headers
    from hbmserve.deployments.ingress.request_body import BodyLimits, read_body
    from hbmserve.deployments.wire.chunk_push import pushing
    from hbmserve.deployments.wire.upstream import UpstreamPool

    pool, limits = UpstreamPool(), BodyLimits()

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(scope, receive, limits)
        headers = upstream_headers(scope["headers"], token)
        await relay(pool, url + scope["path"], scope["method"], headers, body, pushing(send, scope),
                    limits.first_byte_timeout_s, asyncio.get_running_loop().time())
    return app
