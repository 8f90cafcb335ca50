"""The listener every hbmserve socket uses (deployments/wire/hardened_http.py), attacked on real loopback
sockets: header floods, too many headers, sockets that send nothing; on the front door's server
and on a replica's (deployments/replica/replica_http.py `AsgiListener`). Each attack passed on the listeners
before these limits: an endless header block was buffered, 200 headers were served, a silent
socket was kept until the header deadline (front door) or forever (replica)."""

from __future__ import annotations

import asyncio
import time

import pytest

from hbmserve.ops.bench.header_flood import send_flood
from hbmserve.deployments.replica.replica_http import AsgiListener
from hbmserve.deployments.wire.hardened_http import HardenedServer, HttpLimits, listen_socket

LIMITS = HttpLimits(header_timeout_s=5.0, keep_alive_s=5, idle_connection_s=0.3)


def run(coro, timeout: float = 30):
    return asyncio.run(asyncio.wait_for(coro, timeout=timeout))


async def echo_size(scope, receive, send):
    """Answers with how many body bytes it read."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        msg = await receive()
        size += len(msg.get("body", b""))
        more = msg.get("more_body", False)
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def front_door_port(limits: HttpLimits = LIMITS):
    sock = listen_socket("127.0.0.1", 0, shared=False)
    server = HardenedServer(echo_size, limits)
    await server.start([sock])
    return server, sock.getsockname()[1]


async def replica_port():
    listener = AsgiListener()
    url = await listener.serve(echo_size, "127.0.0.1")
    return listener, int(url.rsplit(":", 1)[1])


@pytest.mark.parametrize("listener", ["front door", "replica"])
def test_an_endless_header_block_is_refused_431_after_the_cap(listener):
    async def scenario():
        server, port = await (front_door_port() if listener == "front door" else replica_port())
        try:
            sent, answer, grown = await send_flood(port, 64 * 1024 * 1024)
            return sent, answer, grown / 2**20
        finally:
            await server.stop()

    sent, answer, grown_mib = run(scenario())
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
    # Refused within the cap plus what the socket buffers held, not after the 64 MiB the
    # client had (the flood once grew a front door by 600 MiB in 1.6 s); memory stays flat.
    assert sent < 16 * 1024 * 1024 and grown_mib < 32, (sent, grown_mib)


@pytest.mark.parametrize("listener", ["front door", "replica"])
def test_too_many_headers_are_refused_431(listener):
    async def scenario():
        server, port = await (front_door_port() if listener == "front door" else replica_port())
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n" + b"".join(b"x-h%d: 1\r\n" % i for i in range(200)) + b"\r\n")
            answer = await asyncio.wait_for(reader.read(4096), timeout=5)
            closed = await asyncio.wait_for(reader.read(), timeout=5) == b""
            writer.close()
            return answer, closed
        finally:
            await server.stop()

    answer, closed = run(scenario())
    assert answer.startswith(b"HTTP/1.1 431 ") and closed, answer[:80]


def test_a_socket_that_sends_nothing_is_closed_after_the_idle_deadline():
    async def scenario():
        server, port = await front_door_port()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            t0 = time.monotonic()
            data = await asyncio.wait_for(reader.read(), timeout=5)  # EOF when the server closes
            writer.close()
            return data, time.monotonic() - t0
        finally:
            await server.stop()

    data, waited = run(scenario())
    assert data == b"" and waited < 3.0  # the header deadline (5 s) would have come later


def test_a_replica_closes_a_silent_socket_too():
    async def scenario():
        listener, port = await replica_port()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            data = await asyncio.wait_for(reader.read(), timeout=8)  # the replica's default: 2 s
            writer.close()
            return data
        finally:
            await listener.stop()

    assert run(scenario()) == b""


def test_a_large_body_sent_with_its_headers_is_not_taken_for_a_header_flood():
    """Headers and a 2 MiB body in one write, with 40 headers: the body is not counted."""
    body = b"b" * (2 * 1024 * 1024)

    async def scenario():
        server, port = await front_door_port()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            headers = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 200) for i in range(40))
            writer.write(b"POST / HTTP/1.1\r\nhost: x\r\n" + headers
                         + b"content-length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(4096), timeout=10)
            writer.close()
            return answer
        finally:
            await server.stop()

    answer = run(scenario())
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(str(len(body)).encode()), answer[:200]


def test_keep_alive_requests_each_get_the_header_caps():
    """A second request on the same connection starts a fresh count: two requests of 40 headers
    each are served, not refused as 80."""
    async def scenario():
        server, port = await front_door_port(HttpLimits(max_headers=50, idle_connection_s=0.3))
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            request = b"GET / HTTP/1.1\r\nhost: x\r\n" + b"".join(b"x-h%d: 1\r\n" % i for i in range(40)) + b"\r\n"
            answers = []
            for _ in range(2):
                writer.write(request)
                answers.append(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5))
                await asyncio.wait_for(reader.readexactly(1), timeout=5)  # the body: "0"
            writer.close()
            return answers
        finally:
            await server.stop()

    answers = run(scenario())
    assert [a.split(b"\r\n")[0] for a in answers] == [b"HTTP/1.1 200 OK"] * 2
    names = [line.split(b":")[0].lower() for line in answers[0].split(b"\r\n")[1:] if line]
    assert names.count(b"date") == 1 and b"server" not in names  # no software name handed out


def test_too_many_headers_with_a_body_in_the_same_write_reach_no_app():
    seen = []

    async def recording(scope, receive, send):
        seen.append(scope["path"])
        await echo_size(scope, receive, send)

    async def scenario():
        sock = listen_socket("127.0.0.1", 0, shared=False)
        server = HardenedServer(recording, LIMITS)
        await server.start([sock])
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
            writer.write(b"POST /x HTTP/1.1\r\nhost: x\r\n" + b"".join(b"x-h%d: 1\r\n" % i for i in range(200))
                         + b"content-length: 5\r\n\r\nhello")
            answer = await asyncio.wait_for(reader.read(), timeout=5)
            writer.close()
            return answer
        finally:
            await server.stop()

    answer = run(scenario())
    assert answer.startswith(b"HTTP/1.1 431 ") and answer.count(b"HTTP/1.1") == 1 and seen == [], answer


def test_starting_a_server_leaves_the_process_s_log_handlers_open():
    # Serve's replica logger buffers through a MemoryHandler to its file; were it closed (its
    # target set to None), Serve's recovering controller would fail every replica's
    # is_allocated() and stop the fleet (tests/integration/test_autoscale_live_parity.py).
    import logging
    import logging.handlers

    logger = logging.getLogger("hbmserve.test.memory_handler")
    target = logging.StreamHandler()
    handler = logging.handlers.MemoryHandler(capacity=10, target=target)
    logger.addHandler(handler)
    try:
        HardenedServer(echo_size, HttpLimits())
        assert handler.target is target
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_stream_s_pieces_leave_at_once_on_either_loop(loop):
    """TCP_NODELAY on every accepted socket. asyncio's loop sets it only on sockets made with
    IPPROTO_TCP, which `listen_socket`'s were not; without it each piece after the first waited
    for the client's delayed ACK (a two-piece stream took 44 ms on asyncio, 0.8 on uvloop)."""
    import socket

    import httpx
    import uvloop

    async def main() -> tuple[list[int], bytes]:
        nodelay = []

        async def two_pieces(scope, receive, send):
            if scope["type"] != "http":
                return
            for protocol in server._server.server_state.connections:
                nodelay.append(protocol.transport.get_extra_info("socket").getsockopt(
                    socket.IPPROTO_TCP, socket.TCP_NODELAY))
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"one ", "more_body": True})
            await asyncio.sleep(0)
            await send({"type": "http.response.body", "body": b"two"})

        sock = listen_socket("127.0.0.1", 0, shared=False)
        server = HardenedServer(two_pieces, LIMITS)
        await server.start([sock])
        try:
            async with httpx.AsyncClient() as client:
                r = await client.get("http://127.0.0.1:%d/" % sock.getsockname()[1])
        finally:
            await server.stop()
        return nodelay, r.content

    nodelay, body = (uvloop.run if loop == "uvloop" else asyncio.run)(asyncio.wait_for(main(), 30))
    assert body == b"one two"
    assert nodelay and all(nodelay), nodelay
