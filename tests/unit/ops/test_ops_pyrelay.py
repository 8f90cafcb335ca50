"""ops/bench/pyrelay.py: the bare relay passes every reply whole and knows where each one ends,
however the replica's bytes are cut, so its keep-alive connection goes back to the pool."""

from __future__ import annotations

import asyncio

from hbmserve.ops.bench.pyrelay import PyRelay, Upstream

CHUNKED = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
           b"7\r\ndata: a\r\n" b"a;ext=1\r\ndata: bcde\r\n" b"0\r\n\r\n")
SIZED = b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nnope!"


def _ends(reply: bytes, cut: int) -> list[bool]:
    up = Upstream(PyRelay("127.0.0.1", 1))
    return [up._ended(reply[i:i + cut]) for i in range(0, len(reply), cut)]


def test_a_reply_ends_on_its_last_byte_however_it_is_cut():
    for reply in (CHUNKED, SIZED):
        for cut in (1, 2, 3, 7, len(reply)):
            ends = _ends(reply, cut)
            assert ends[-1] and not any(ends[:-1]), (reply[:12], cut, ends)


def test_two_requests_on_one_client_connection_share_one_pooled_replica_connection():
    async def main() -> tuple[list[bytes], int]:
        opened = 0

        async def replica(reader, writer):
            nonlocal opened
            opened += 1
            while (head := await reader.readuntil(b"\r\n\r\n")):
                size = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                body = await reader.readexactly(size)
                for piece in (CHUNKED[:40], CHUNKED[40:70], CHUNKED[70:]):  # the head split mid-line
                    writer.write(piece.replace(b"bcde", body[:4]))
                    await writer.drain()
                    await asyncio.sleep(0.01)

        server = await asyncio.start_server(replica, "127.0.0.1", 0)
        relay = PyRelay("127.0.0.1", server.sockets[0].getsockname()[1])
        url = await relay.serve()
        reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
        replies = []
        for body in (b"wxyz", b"WXYZ"):
            writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n\r\n" + body)
            replies.append(await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5))
        writer.close()
        relay.server.close()
        server.close()
        return replies, opened

    replies, opened = asyncio.run(main())
    assert replies == [CHUNKED.replace(b"bcde", b"wxyz"), CHUNKED.replace(b"bcde", b"WXYZ")]
    assert opened == 1
