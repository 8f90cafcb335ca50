"""The relay's HTTP/1.1 client (deployments/wire/upstream.py) against raw asyncio servers on
loopback that write exactly the bytes each case needs: keep-alive reuse, chunked and
content-length bodies, a reused socket the replica closed, a reply cut or garbled, a reply
closed from outside (a replica found gone), and a reply larger than the high-water mark."""

from __future__ import annotations

import asyncio

import pytest

from hbmserve.deployments.wire.upstream import HIGH_WATER_BYTES, UpstreamPool


def run(coro, timeout: float = 20):
    return asyncio.run(asyncio.wait_for(coro, timeout=timeout))


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return head, await reader.readexactly(length)


async def serve(handler) -> tuple[asyncio.AbstractServer, str, list[int]]:
    """A server calling `handler(reader, writer, n)` for each connection; the list counts them."""
    conns: list[int] = []

    async def on_conn(reader, writer):
        conns.append(1)
        try:
            await handler(reader, writer, len(conns))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    return server, "http://127.0.0.1:%d" % server.sockets[0].getsockname()[1], conns


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def read_all(resp) -> bytes:
    out = []
    while piece := await resp.read():
        out.append(piece)
    return b"".join(out)


def test_requests_reuse_one_keep_alive_connection_and_bodies_arrive_decoded():
    seen = []

    async def echo(reader, writer, _):
        while True:
            head, body = await read_request(reader)
            seen.append((head, body))
            if body == b"stream":
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                             + chunked(b"data: 1\n\n", b"data: 2\n\n"))
            else:
                writer.write(b"HTTP/1.1 201 Created\r\ncontent-length: %d\r\nX-Any: v\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    async def scenario():
        server, url, conns = await serve(echo)
        pool = UpstreamPool()
        try:
            first = await pool.request("POST", url + "/v1/completions?x=1", {"authorization": "b", "X-Tok": "t"}, b"stream")
            assert first.status == 200 and first.header(b"content-type") == b"text/event-stream"
            assert await read_all(first) == b"data: 1\n\ndata: 2\n\n" and first.at_eof
            first.release()
            second = await pool.request("POST", url + "/v1/other", {}, b"hello")
            assert (second.status, second.header(b"x-any"), await read_all(second)) == (201, b"v", b"hello")
            second.release()
            assert len(conns) == 1 and pool.open_connections == 1
            assert seen[0][0].startswith(b"POST /v1/completions?x=1 HTTP/1.1\r\n") and b"x-tok: t" in seen[0][0].lower()
        finally:
            await pool.close()
            server.close()

    run(scenario())


def test_a_reused_connection_the_replica_closed_is_replaced_once_without_an_error():
    async def one_reply_per_connection(reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        await read_request(reader)  # the second request on this socket: hang up unanswered
        writer.transport.abort()

    async def scenario():
        server, url, conns = await serve(one_reply_per_connection)
        pool = UpstreamPool()
        try:
            for _ in range(3):
                resp = await pool.request("POST", url + "/", {}, b"{}")
                assert await read_all(resp) == b"ok"
                resp.release()
            assert len(conns) == 3
        finally:
            await pool.close()
            server.close()

    run(scenario())


@pytest.mark.parametrize("reply", [
    b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",  # the replica dies before the body ends
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\nZZ\r\n",  # not a chunk size
])
def test_a_cut_or_garbled_reply_is_a_connection_reset_after_what_arrived(reply):
    async def broken(reader, writer, _):
        await read_request(reader)
        writer.write(reply)
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.transport.abort()

    async def scenario():
        server, url, _ = await serve(broken)
        pool = UpstreamPool()
        try:
            resp = await pool.request("POST", url + "/", {}, b"{}")
            got = []
            with pytest.raises(ConnectionResetError):
                while piece := await resp.read():
                    got.append(piece)
            resp.release()
            await asyncio.sleep(0.05)  # the aborted socket's connection_lost runs on the next turns
            assert b"".join(got) in (b"short", b"hello") and pool.open_connections == 0
        finally:
            await pool.close()
            server.close()

    run(scenario())


def test_nothing_listening_and_a_silent_hang_up_fail_before_any_status():
    async def hang_up(reader, writer, _):
        await read_request(reader)
        writer.close()

    async def scenario():
        server, url, _ = await serve(hang_up)
        closed_port = server.sockets[0].getsockname()[1]
        pool = UpstreamPool()
        try:
            with pytest.raises(ConnectionResetError):
                await pool.request("POST", url + "/", {}, b"{}")
            server.close()
            await server.wait_closed()
            with pytest.raises(ConnectionRefusedError):
                await pool.request("POST", "http://127.0.0.1:%d/" % closed_port, {}, b"{}")
        finally:
            await pool.close()

    run(scenario())


def test_closing_a_reply_from_outside_wakes_its_reader_with_a_reset():
    async def one_token_then_wait(reader, writer, _):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"3\r\nabc\r\n")
        await writer.drain()
        await asyncio.sleep(10)

    async def scenario():
        server, url, _ = await serve(one_token_then_wait)
        pool = UpstreamPool()
        try:
            resp = await pool.request("POST", url + "/", {}, b"{}")
            assert await resp.read() == b"abc"
            asyncio.get_running_loop().call_later(0.2, resp.close)  # the replica table found it gone
            with pytest.raises(ConnectionResetError):
                await resp.read()
            resp.release()
        finally:
            await pool.close()
            server.close()

    run(scenario())


BIG = bytes(range(256)) * (3 * HIGH_WATER_BYTES // 256)  # a reply three high-water marks long


async def large(reader, writer, _):
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(BIG))
    for i in range(0, len(BIG), 65536):
        writer.write(BIG[i:i + 65536])
        await writer.drain()


def test_a_reply_larger_than_the_high_water_mark_arrives_whole():
    async def scenario():
        server, url, _ = await serve(large)
        pool = UpstreamPool()
        try:
            resp = await pool.request("POST", url + "/", {}, b"{}")
            await asyncio.sleep(0.3)  # let the door's buffer fill past the mark: reading pauses
            assert resp._conn.paused
            assert await read_all(resp) == BIG
            resp.release()
        finally:
            await pool.close()
            server.close()

    run(scenario())


def test_a_pumped_body_reaches_the_sink_piece_by_piece_and_the_connection_is_reused():
    """`pump` hands each piece to the sink as it arrives (what came before the pump first), then
    returns at the reply's end, leaving a clean keep-alive connection."""
    async def stream(reader, writer, _):
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                         + b"%x\r\n%s\r\n" % (9, b"data: 0\n\n"))
            await writer.drain()
            for i in range(1, 6):
                await asyncio.sleep(0.02)  # one piece per socket read
                writer.write(b"%x\r\n%s\r\n" % (9, b"data: %d\n\n" % i))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async def scenario():
        server, url, conns = await serve(stream)
        pool = UpstreamPool()
        try:
            resp = await pool.request("POST", url + "/", {}, b"{}")
            assert await resp.read() == b"data: 0\n\n"
            pieces: list[bytes] = []
            await resp.pump(lambda piece: pieces.append(piece) is None, asyncio.sleep)
            assert b"".join(pieces) == b"".join(b"data: %d\n\n" % i for i in range(1, 6)) and len(pieces) >= 3
            resp.release()
            again = await pool.request("POST", url + "/", {}, b"{}")
            assert await read_all(again) == b"".join(b"data: %d\n\n" % i for i in range(6))
            again.release()
            assert len(conns) == 1
        finally:
            await pool.close()
            server.close()

    run(scenario())


def test_a_full_sink_pauses_reading_until_it_drains_and_nothing_is_lost():
    async def scenario():
        server, url, _ = await serve(large)
        pool = UpstreamPool()
        got, drained = [], asyncio.Event()
        conn_paused = []

        async def drain():
            conn_paused.append(resp._conn.sink_full)  # reading stopped while the sink was full
            await asyncio.sleep(0.05)
            drained.set()

        try:
            resp = await pool.request("POST", url + "/", {}, b"{}")
            # Full after every piece: each must wait for a drain before the next is read.
            await resp.pump(lambda piece: got.append(piece) and False, drain)
            assert b"".join(got) == BIG and drained.is_set() and all(conn_paused)
            assert resp._conn.transport.is_reading()  # full at the last piece: reading resumed for reuse
            resp.release()
        finally:
            await pool.close()
            server.close()

    run(scenario())


def test_a_sink_that_raises_breaks_the_reply_and_its_connection_is_not_reused():
    async def stream(reader, writer, _):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(5):
            writer.write(b"%x\r\n%s\r\n" % (9, b"data: %d\n\n" % i))
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def scenario():
        server, url, conns = await serve(stream)
        pool = UpstreamPool()
        seen = []

        def sink(piece: bytes) -> bool:
            seen.append(piece)
            if b"2" in piece:
                raise ConnectionResetError("the engine sent an error event")
            return True

        try:
            resp = await pool.request("POST", url + "/", {}, b"{}")
            with pytest.raises(ConnectionResetError, match="error event"):
                await resp.pump(sink, asyncio.sleep)
            assert not any(b"3" in p for p in seen)  # nothing after the break reached the sink
            resp.release()
            await asyncio.sleep(0.05)  # the aborted socket's close is reported on a later loop turn
            assert pool.open_connections == 0 and len(conns) == 1
        finally:
            await pool.close()
            server.close()

    run(scenario())


def test_get_returns_a_small_reply_whole_and_a_silent_one_times_out_without_reuse():
    async def handler(reader, writer, n):
        while True:
            head, _ = await read_request(reader)
            if b"/silent" in head:
                await asyncio.sleep(5)  # answers nothing within the caller's timeout
                return
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(b'{"wai', b'ting":1}'))
            await writer.drain()

    async def scenario():
        server, url, conns = await serve(handler)
        pool = UpstreamPool()
        try:
            assert await pool.get(url + "/hbm/load", {"x-tok": "t"}, 2.0) == (200, b'{"waiting":1}')
            assert await pool.get(url + "/hbm/load", {}, 2.0) == (200, b'{"waiting":1}')
            assert len(conns) == 1  # the second poll reused the first's connection
            with pytest.raises(TimeoutError):
                await pool.get(url + "/silent", {}, 0.2)
            assert await pool.get(url + "/hbm/load", {}, 2.0) == (200, b'{"waiting":1}')
            assert len(conns) == 2  # the timed-out connection was dropped, not pooled
        finally:
            await pool.close()
            server.close()

    run(scenario())
