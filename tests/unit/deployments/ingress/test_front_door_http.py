"""The front door's HTTP plumbing on real loopback sockets: header timeouts (slowloris), and the
relay's failure semantics (retry only before the first byte; a broken stream ends with an SSE
error event), and a stream's middle pushed to the client's socket (whole, in order, held back
by a client that stops reading). No Ray: the servers here are uvicorn and raw asyncio sockets
in this process."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest

from hbmserve.deployments.wire.hardened_http import HardenedServer, HttpLimits, listen_socket
from hbmserve.deployments.ingress.relay import NotStarted, relay
from hbmserve.deployments.wire.upstream import UpstreamPool


def run(coro, timeout: float = 30):
    return asyncio.run(asyncio.wait_for(coro, timeout=timeout))


async def ok_app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def start(app, limits: HttpLimits) -> tuple[HardenedServer, int]:
    sock = listen_socket("127.0.0.1", 0, shared=False)
    server = HardenedServer(app, limits)
    await server.start([sock])
    return server, sock.getsockname()[1]


def test_slow_headers_are_cut_off_while_real_clients_are_served():
    async def scenario():
        server, port = await start(ok_app, HttpLimits(header_timeout_s=0.5, keep_alive_s=5))
        try:
            slow = []
            for _ in range(20):  # slowloris: a request line and one header byte, then nothing
                r, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX")
                slow.append((r, w))
            async with httpx.AsyncClient() as client:
                assert (await client.get(f"http://127.0.0.1:{port}/")).status_code == 200
            await asyncio.sleep(1.0)
            closed = []
            for r, w in slow:
                data = await asyncio.wait_for(r.read(), timeout=2)  # EOF: the server closed it
                closed.append(data)
                w.close()
            assert all(d.startswith(b"HTTP/1.1 408") for d in closed), closed[:2]
            assert server.connections == 0
        finally:
            await server.stop()

    run(scenario())


def test_idle_connection_between_requests_gets_the_same_header_deadline():
    async def scenario():
        server, port = await start(ok_app, HttpLimits(header_timeout_s=0.5, keep_alive_s=30))
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            first = await asyncio.wait_for(r.readuntil(b"ok"), timeout=2)
            assert first.startswith(b"HTTP/1.1 200")
            w.write(b"GET / HTTP/1.1\r\nHo")  # the next request stalls mid-headers
            rest = await asyncio.wait_for(r.read(), timeout=3)
            assert b"HTTP/1.1 408 Request Timeout" in rest  # after the first reply's last chunk
            w.close()
        finally:
            await server.stop()

    run(scenario())


async def raw_upstream(handler) -> tuple[asyncio.AbstractServer, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, "http://127.0.0.1:%d" % server.sockets[0].getsockname()[1]


async def read_request(reader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
    await reader.readexactly(length)


class Collector:
    def __init__(self):
        self.messages = []

    async def __call__(self, message):
        self.messages.append(message)

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")


def test_refused_and_silently_closed_replicas_fail_before_first_byte():
    async def scenario():
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        refused_url = "http://127.0.0.1:%d" % free.getsockname()[1]
        free.close()  # nothing listens there now

        async def hang_up(reader, writer):
            await read_request(reader)
            writer.close()

        server, closing_url = await raw_upstream(hang_up)
        sent = Collector()
        session = UpstreamPool()
        for url in (refused_url, closing_url):
            with pytest.raises(NotStarted):
                await relay(session, url + "/v1/completions", "POST", {}, b"{}", sent, 5, 0.0)
        server.close()
        assert sent.messages == []  # nothing reached the client: a retry elsewhere is safe

    run(scenario())


def test_a_stream_broken_mid_way_ends_with_an_sse_error_event():
    async def two_tokens_then_die(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(2):
            event = b'data: {"choices":[{"text":"t%d"}]}\n\n' % i
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await asyncio.sleep(0.3)  # the two tokens reach the client first
        writer.transport.abort()  # the replica process dies: no terminating chunk

    async def scenario():
        server, url = await raw_upstream(two_tokens_then_die)
        sent = Collector()
        session = UpstreamPool()
        result = await relay(session, url + "/v1/completions", "POST", {}, b"{}", sent, 5, 0.0)
        server.close()
        assert sent.messages[0]["status"] == 200 and result.completed is False
        events = [line.removeprefix("data: ") for line in sent.body.decode().splitlines() if line.startswith("data: ")]
        assert [json.loads(e)["choices"][0]["text"] for e in events[:2]] == ["t0", "t1"]
        assert json.loads(events[-1])["error"]["code"] == "replica_failed"
        assert sent.messages[-1].get("more_body", False) is False  # the client's stream is closed cleanly

    run(scenario())


def test_a_whole_reply_is_relayed_with_status_and_headers():
    async def answer(reader, writer):
        await read_request(reader)
        body = b'{"error": {"message": "bad", "type": "invalid_request_error"}}'
        writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ndate: Mon, 07 Dec 2026 19:07:40 GMT"
                     b"\r\nserver: uvicorn\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    async def scenario():
        server, url = await raw_upstream(answer)
        sent = Collector()
        session = UpstreamPool()
        result = await relay(session, url + "/v1/completions", "POST", {}, b"{}", sent, 5, 0.0)
        server.close()
        assert result.status == 400 and result.completed
        headers = dict(sent.messages[0]["headers"])
        assert headers[b"content-type"] == b"application/json"
        assert b"date" not in headers and b"server" not in headers  # the door's listener writes its own date
        assert json.loads(sent.body)["error"]["message"] == "bad"

    run(scenario())


def test_a_replica_that_accepts_and_stays_silent_times_out_before_any_byte():
    from hbmserve.deployments.ingress.relay import FirstByteTimeout

    async def silent(reader, writer):
        await read_request(reader)
        await asyncio.sleep(5)

    async def scenario():
        server, url = await raw_upstream(silent)
        sent = Collector()
        session = UpstreamPool()
        with pytest.raises(FirstByteTimeout):
            await relay(session, url + "/v1/completions", "POST", {}, b"{}", sent, 0.3, 0.0)
        server.close()
        return sent.messages

    assert run(scenario()) == []  # the app answers 504 itself; nothing was sent yet


async def relaying_server(url: str, pushed: list[int]) -> tuple[HardenedServer, int, UpstreamPool]:
    """A listener whose app relays every request to `url` as the front door does, with the
    listener's push (wire/chunk_push.py); `pushed` counts the pieces written by the push."""
    from hbmserve.deployments.wire.chunk_push import ObservedPush, pushing

    pool = UpstreamPool()

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        send = pushing(send, scope)
        send.push = ObservedPush(send.push, lambda body: pushed.append(len(body)))
        await relay(pool, url + "/v1/completions", "POST", {}, b"{}", send, 5, 0.0)

    server, port = await start(app, HttpLimits(keep_alive_s=5))
    return server, port, pool


def sse_chunk(i: int) -> bytes:
    event = b'data: {"choices":[{"text":"t%d"}]}\n\n' % i
    return b"%x\r\n%s\r\n" % (len(event), event)


def test_a_stream_through_a_real_listener_is_pushed_whole_and_in_order_and_a_break_still_ends_it():
    async def tokens(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(20):
            writer.write(sse_chunk(i))
            await writer.drain()
            await asyncio.sleep(0.005)
        if reader_dies[0]:
            writer.transport.abort()  # the replica dies mid-stream
            return
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def scenario():
        upstream, url = await raw_upstream(tokens)
        pushed: list[int] = []
        server, port, pool = await relaying_server(url, pushed)
        try:
            async with httpx.AsyncClient() as client:
                whole = await client.post(f"http://127.0.0.1:{port}/v1/completions", content=b"{}")
                reader_dies[0] = True
                broken = await client.post(f"http://127.0.0.1:{port}/v1/completions", content=b"{}")
        finally:
            await server.stop()
            await pool.close()
            upstream.close()
        texts = [json.loads(line[6:])["choices"][0]["text"] for line in whole.text.splitlines() if line.startswith("data: ")]
        assert texts == [f"t{i}" for i in range(20)]
        assert len(pushed) >= 10  # the middle of each stream went through the push, not ASGI send
        events = [line[6:] for line in broken.text.splitlines() if line.startswith("data: ")]
        assert [json.loads(e)["choices"][0]["text"] for e in events[:-1]] == [f"t{i}" for i in range(20)]
        assert json.loads(events[-1])["error"]["code"] == "replica_failed"

    reader_dies = [False]
    run(scenario())


def test_a_client_that_stops_reading_stops_the_relay_reading_the_replica_and_loses_nothing():
    """40 MB of events, far past what the sockets' buffers hold (10-12 MB here; the client's
    receive buffer is pinned small): while the client reads nothing, the replica's writes must
    stall. Without the pause every piece is written (measured: 10,000 of 10,000)."""
    total, size = 10000, 4096
    written = []

    async def flood(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(total):
            writer.write(b"%x\r\n%s\r\n" % (size, b"x" * (size - 10) + b"%08d\n\n" % i))
            await writer.drain()  # blocks while the door has stopped reading
            written.append(i)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def scenario():
        upstream, url = await raw_upstream(flood)
        server, port, pool = await relaying_server(url, [])
        try:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            sock.connect(("127.0.0.1", port))
            r, w = await asyncio.open_connection(sock=sock, limit=2**16)
            w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-length: 2\r\n\r\n{}")
            await r.readuntil(b"\r\n\r\n")  # the status line; then the client reads nothing for a while
            await asyncio.sleep(1.0)
            stalled_at = len(written)
            body = bytearray()
            while not body.endswith(b"0\r\n\r\n"):
                body += await asyncio.wait_for(r.read(2**16), timeout=10)
            w.close()
        finally:
            await server.stop()
            await pool.close()
            upstream.close()
        assert stalled_at < total // 2, stalled_at  # the replica was held back, not buffered whole in the door
        numbers = [int(piece[-8:]) for piece in bytes(body).split(b"\n\n") if piece[-8:].isdigit()]
        assert numbers == list(range(total)), stalled_at  # every piece, in order

    run(scenario())
