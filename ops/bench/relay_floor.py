"""What one streamed chunk costs a Python process at each end of a loopback hop (issue 22, req 2):
the floor under the front door's per-chunk CPU, for choosing how to cut it.

The front door reads every SSE chunk from a replica (aiohttp, over TCP) and writes it to the client
(uvicorn's ASGI `send`, which frames each one as an HTTP chunk). Here one process streams
`--streams` x `--chunks` vLLM-sized SSE events and another reads them, and each side's CPU is read
from /proc (its threads' scheduler run time) and divided by the chunks. Ways measured, interleaved per round:
* `asgi -> aiohttp/tcp`: what the door does on both legs today (uvicorn + ASGI writing; aiohttp
  reading over TCP loopback);
* `asgi -> aiohttp/unix`: the same over a Unix socket (a door and a replica on one node);
* `protocol -> protocol/tcp`: a bare asyncio.Protocol at each end: pre-framed chunks written to the
  transport, bytes taken in `data_received` with no HTTP parsing: the relay's floor in Python.

    python -m hbmserve.ops.bench.relay_floor --rounds 3 --out out/relay_floor.json

Measured here, not claimed for other machines; no Ray, vLLM or hbmserve code runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hbmserve.ops.bench.cpu_split import cpu_s

EVENT = (b'data: {"id":"cmpl-0","object":"text_completion","created":0,"model":"m","choices":[{"index":0,'
         b'"text":" token","logprobs":null,"finish_reason":null,"token_ids":[1234]}]}\n\n')
WAYS = ("asgi -> aiohttp/tcp", "asgi -> aiohttp/unix", "protocol -> protocol/tcp")
STEP_S = 0.0005  # between a stream's chunks: an engine step, short enough to keep the reader busy


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _serve_asgi(where: str, chunks: int) -> None:
    import uvicorn

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for _ in range(chunks):
            await send({"type": "http.response.body", "body": EVENT, "more_body": True})
            await asyncio.sleep(STEP_S)
        await send({"type": "http.response.body", "body": b""})

    kw = {"uds": where} if where.startswith("/") else {"host": "127.0.0.1", "port": int(where)}
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", http="httptools", lifespan="off", **kw))
    await server.serve()


class _Writer(asyncio.Protocol):
    def __init__(self, chunks: int) -> None:
        self.chunks = chunks

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if b"\r\n\r\n" in data:
            asyncio.get_running_loop().create_task(self._stream())

    async def _stream(self) -> None:
        self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        framed = _chunk(EVENT)
        for _ in range(self.chunks):
            self.transport.write(framed)
            await asyncio.sleep(STEP_S)
        self.transport.write(b"0\r\n\r\n")


async def _serve_protocol(where: str, chunks: int) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: _Writer(chunks), "127.0.0.1", int(where))
    await server.serve_forever()


class _Reader(asyncio.Protocol):
    def __init__(self, done: asyncio.Future) -> None:
        self.done, self.reads = done, 0

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        if data.endswith(b"0\r\n\r\n") and not self.done.done():
            self.done.set_result(self.reads)


async def _read(way: str, where: str, streams: int) -> int:
    """Read `streams` streams at once; the reads made."""
    if way.endswith("protocol/tcp"):
        loop = asyncio.get_running_loop()

        async def one() -> int:
            done = loop.create_future()
            transport, _ = await loop.create_connection(lambda: _Reader(done), "127.0.0.1", int(where))
            transport.write(b"GET /s HTTP/1.1\r\nhost: x\r\n\r\n")
            try:
                return await done
            finally:
                transport.close()
        return sum(await asyncio.gather(*(one() for _ in range(streams))))
    import aiohttp

    unix = way.endswith("unix")
    connector = aiohttp.UnixConnector(path=where) if unix else aiohttp.TCPConnector(limit=0)
    url = "http://localhost/s" if unix else f"http://127.0.0.1:{where}/s"
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one() -> int:
            reads = 0
            async with session.get(url) as resp:
                async for _ in resp.content.iter_any():
                    reads += 1
            return reads
        return sum(await asyncio.gather(*(one() for _ in range(streams))))


def _wait_listening(where: str, proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the writer exited with {proc.returncode}")
        try:
            with socket.socket(socket.AF_UNIX if where.startswith("/") else socket.AF_INET) as s:
                s.connect(where if where.startswith("/") else ("127.0.0.1", int(where)))
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"the writer did not listen on {where}")


def one_run(way: str, streams: int, chunks: int, port: int, tmp: str) -> dict:
    where = os.path.join(tmp, "relay.sock") if way.endswith("unix") else str(port)
    if where.startswith("/") and os.path.exists(where):
        os.unlink(where)
    writer = "protocol" if way.startswith("protocol") else "asgi"
    proc = subprocess.Popen([sys.executable, "-m", "hbmserve.ops.bench.relay_floor", "--serve", writer, where,
                             str(chunks)])
    try:
        _wait_listening(where, proc)
        w0, r0, t0 = cpu_s(proc.pid), time.process_time(), time.monotonic()
        reads = asyncio.run(_read(way, where, streams))
        w1, r1, wall = cpu_s(proc.pid), time.process_time(), time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    n = streams * chunks
    return {"way": way, "chunks": n, "reads": reads, "wall_s": round(wall, 2),
            "writer_us_per_chunk": round(1e6 * (w1 - w0) / n, 2), "reader_us_per_chunk": round(1e6 * (r1 - r0) / n, 2)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--chunks", type=int, default=2000, help="per stream")
    ap.add_argument("--port", type=int, default=18790)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)  # a child: WRITER WHERE CHUNKS
    args = ap.parse_args(argv)
    if args.serve:
        writer, where, chunks = args.serve
        asyncio.run((_serve_protocol if writer == "protocol" else _serve_asgi)(where, int(chunks)))
        return
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for way in WAYS:
                runs.append({"round": r, **one_run(way, args.streams, args.chunks, args.port, tmp)})
                print(json.dumps(runs[-1]), flush=True)
    summary = {way: {k: statistics.median(x[k] for x in runs if x["way"] == way)
                     for k in ("writer_us_per_chunk", "reader_us_per_chunk")} for way in WAYS}
    for way, s in summary.items():
        print(f"{way:26s} writer {s['writer_us_per_chunk']:5.1f} us/chunk, reader {s['reader_us_per_chunk']:5.1f} us/chunk "
              f"(medians of {args.rounds})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"runs": runs, "medians": summary, "args": vars(args) | {"out": str(args.out)}},
                                       indent=1, default=str))


if __name__ == "__main__":
    main()
