"""The front door's HTTP/1.1 client for the relay: keep-alive connections pooled per replica,
httptools' C parser, and each body piece handed to the relay as it arrives.

Why not aiohttp, which the door uses for everything else (prefill, metrics, KV events): the relay
is the path every streamed token takes, and there aiohttp costs ~21 us a chunk where a bare
asyncio.Protocol costs ~13.5 (ops/bench/relay_floor.py), plus its request machinery (timers,
multidicts, a payload writer) on every request. Issue 22 measured the door as the whole gap to
bare vLLM on this machine (docs/benchmarks.md), so this client does only what the relay needs:
one request at a time per connection, a whole request body, a reply with a content length or
chunked encoding. A reply the parser cannot read is a broken connection, never a guess.

A body is taken by `read()`, a piece per wake-up of the reader, or by `pump(sink)`, which hands
each piece to `sink` inside the socket's callback: no future and no task wake-up per piece, the
relay's path for a stream once its first piece is out (wire/chunk_push.py).

Errors are OSErrors, as the relay expects of a broken hop: `ConnectionRefusedError` and friends
from connecting, `ConnectionResetError` when the replica goes away or sends what is not HTTP.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Awaitable, Callable
from urllib.parse import urlsplit

import httptools

# A reply held in the door beyond this stops reading the replica until the client takes it.
HIGH_WATER_BYTES = 256 * 1024
# Idle connections older than this are not reused: the replica's listener closes its own at 30 s
# (replica_http.REPLICA_HTTP_LIMITS), and one closing while a request is written to it would
# fail that request for nothing.
IDLE_S = 15.0


class UpstreamResponse:
    """One reply: `status` and `headers` (lower-case names, as bytes) once it starts, then the
    body through `read()`. `release()` when done: the connection goes back to the pool only if
    the reply ended cleanly."""

    def __init__(self, conn: _Connection, status: int, headers: list[tuple[bytes, bytes]]):
        self._conn = conn
        self.status = status
        self.headers = headers

    def header(self, name: bytes) -> bytes:
        return next((v for k, v in self.headers if k == name), b"")

    async def read(self) -> bytes:
        """The body bytes that arrived since the last read (waiting for some); b"" at its end."""
        return await self._conn.read()

    async def pump(self, sink: Callable[[bytes], bool], drain: Callable[[], Awaitable[None]]) -> None:
        """Hand the rest of the body to `sink`, piece by piece as it arrives, until the reply ends;
        raises the connection's error if it breaks. `sink(piece)` returns False when its reader
        is full: reading stops until `drain()` returns. An OSError that `sink` raises breaks the
        reply (the connection is dropped and `pump` raises it)."""
        await self._conn.pump(sink, drain)

    @property
    def at_eof(self) -> bool:
        return self._conn.complete

    def close(self) -> None:
        """Drop the connection now; a read waiting on it raises ConnectionResetError."""
        self._conn.abort("the front door closed the reply")

    def release(self) -> None:
        self._conn.release()


class _Connection(asyncio.Protocol):
    def __init__(self, pool: UpstreamPool, key: tuple[str, int]):
        self.pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.used = False  # has carried a request before: a reuse, which may meet a closed socket
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: list[tuple[bytes, bytes]] = []
        self.started: asyncio.Future | None = None  # resolves with the status at the headers' end
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.waiter: asyncio.Future | None = None
        self.complete = False
        self.error: OSError | None = None
        self.got_bytes = False
        self.paused = False
        self.reusable = True  # False after a HEAD: the parser cannot tell where that reply ends
        self.keep_alive = False
        self.sink: Callable[[bytes], bool] | None = None  # while pumping: takes each body piece
        self.sink_full = False  # the sink's reader is full: reading paused until it drains

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as err:
            self.abort(f"the replica's reply is not HTTP/1.1 the relay reads ({err})")

    def eof_received(self) -> bool:
        self._fail(ConnectionResetError("the replica closed the connection before the reply ended"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool._forget(self)
        self._fail(ConnectionResetError(f"the connection to the replica was lost ({exc or 'closed'})"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self.started is not None and not self.started.done():
            self.started.set_result(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self._to_sink(body)
            return
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER_BYTES and not self.paused and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        # Read it here: llhttp forgets it once the callback returns.
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    # the relay's side
    def send(self, request: bytes) -> asyncio.Future:
        self.started = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.started

    async def read(self) -> bytes:
        while not self.body:
            if self.complete:
                return b""
            if self.error is not None:
                raise self.error
            await self._woken()
        out = self.body.popleft() if len(self.body) == 1 else b"".join(self._drain())
        self.buffered -= len(out)
        if self.paused and self.buffered <= HIGH_WATER_BYTES // 2 and self.transport is not None:
            self.transport.resume_reading()
            self.paused = False
        return out

    async def pump(self, sink: Callable[[bytes], bool], drain: Callable[[], Awaitable[None]]) -> None:
        self.sink = sink
        try:
            while self.body and self.sink is not None:  # what arrived before the pump began
                piece = self.body.popleft()
                self.buffered -= len(piece)
                self._to_sink(piece)
            if self.paused:  # the pump holds nothing back: only a full sink pauses reading now
                self.paused = False
                if not self.sink_full and self.transport is not None:
                    self.transport.resume_reading()
            while True:
                if self.error is not None:
                    raise self.error
                if self.complete:
                    return
                if self.sink_full:
                    await drain()
                    self.sink_full = False
                    if self.transport is not None:
                        self.transport.resume_reading()
                    continue
                await self._woken()
        finally:
            self.sink = None
            if self.sink_full:  # the reply ended while the sink was full: a reused connection must read
                self.sink_full = False
                if self.transport is not None:
                    self.transport.resume_reading()

    async def _woken(self) -> None:
        """Until `_wake`: a body piece, the reply's end, an error or a full sink."""
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def _to_sink(self, piece: bytes) -> None:
        try:
            more = self.sink(piece)
        except OSError as err:  # the sink broke the reply (the engine sent an error event)
            self.sink = None
            self._fail(err)
            if self.transport is not None:
                self.transport.abort()
            return
        if not more and not self.sink_full and self.transport is not None:
            self.sink_full = True
            self.transport.pause_reading()
            self._wake()

    def _drain(self):
        while self.body:
            yield self.body.popleft()

    def release(self) -> None:
        if self.complete and self.keep_alive and self.reusable and self.error is None and not self.body:
            self._reset()
            self.used = True
            self.pool._give_back(self)
        else:
            self.abort("the reply did not end cleanly")

    def abort(self, why: str) -> None:
        self._fail(ConnectionResetError(why))
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, err: OSError) -> None:
        if self.complete or self.error is not None:
            return
        self.error = err
        if self.started is not None and not self.started.done():
            self.started.set_exception(err)
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class UpstreamPool:
    """Keep-alive connections per (host, port), made on demand, reused while idle under IDLE_S."""

    def __init__(self, connect_timeout_s: float = 2.0):
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()

    async def request(self, method: str, url: str, headers: dict[str, str], body: bytes) -> UpstreamResponse:
        """Send one request and wait for its status and headers. A reused connection that the
        replica closed before answering is replaced by a new one once: the replica read nothing."""
        parts = urlsplit(url)
        key = (parts.hostname or "127.0.0.1", parts.port or 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"{method} {target} HTTP/1.1", f"host: {parts.netloc}", f"content-length: {len(body)}",
                 *(f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("host", "content-length"))]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        while True:
            conn = self._reused(key) or await self._connect(key)
            try:
                status = await conn.send(request)
            except ConnectionResetError:
                if conn.used and not conn.got_bytes:
                    conn.abort("reused after the replica closed it")
                    continue
                raise
            except BaseException:
                conn.abort("the request was abandoned")
                raise
            if method == "HEAD":  # no body follows; the parser cannot know that, so no reuse
                conn.complete, conn.reusable = True, False
            return UpstreamResponse(conn, status, conn.headers)

    async def get(self, url: str, headers: dict[str, str], timeout_s: float) -> tuple[int, bytes]:
        """A small reply whole: (status, body), within `timeout_s` (TimeoutError) or an OSError.
        The replicas' load reports go this way, ten a second each: through aiohttp each cost the
        door ~0.35 ms more CPU (docs/benchmarks.md, issue 22)."""
        async with asyncio.timeout(timeout_s):
            resp = await self.request("GET", url, headers, b"")
            try:
                parts = []
                while piece := await resp.read():
                    parts.append(piece)
                return resp.status, b"".join(parts)
            finally:
                resp.release()

    def _reused(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if now - conn.idle_since < IDLE_S and not conn.transport.is_closing():
                return conn
            conn.abort("idle too long")
        return None

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(lambda: _Connection(self, key), *key),
                                             timeout=self.connect_timeout_s)
        except asyncio.TimeoutError:
            raise ConnectionRefusedError(f"no connection to {key[0]}:{key[1]} within "
                                         f"{self.connect_timeout_s:g} s") from None
        self._open.add(conn)
        return conn

    def _give_back(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, []).append(conn)

    def _forget(self, conn: _Connection) -> None:
        self._open.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def close(self) -> None:
        for conn in list(self._open):
            conn.abort("the pool closed")
        self._open.clear()
        self._idle.clear()
