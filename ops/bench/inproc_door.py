"""The front door in its replica's process, for measuring (issue 22's candidate "run the door in
the replica's process on single-replica nodes"): the same FrontDoorApp and relay, calling the
replica's ASGI app in place of a socket. ops/bench/door_cpu.py runs it as its `inproc` side.

Not a product path: there is no backpressure from the client to the replica here, nor a
replica that dies apart from its door, so it shows only what the hop between the two costs.
"""

from __future__ import annotations

import asyncio
from collections import deque
from urllib.parse import urlsplit


class InProcessReply:
    """What `UpstreamPool.request` returns, fed by the replica app's ASGI messages."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.started = loop.create_future()
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False
        self.task: asyncio.Task | None = None
        self._body: deque[bytes] = deque()
        self._waiter: asyncio.Future | None = None
        self._sink = None
        self._released = asyncio.Event()

    # the replica app's side
    async def send(self, message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = [(k.lower(), v) for k, v in message.get("headers", ())]
            self.started.set_result(None)
            return
        if piece := message.get("body", b""):
            if self._sink is not None:
                self._sink(piece)
            else:
                self._body.append(piece)
        if not message.get("more_body", False):
            self.complete = True
        self._wake()

    def receive_of(self, body: bytes):
        sent = False

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await self._released.wait()
            return {"type": "http.disconnect"}
        return receive

    # the relay's side
    def header(self, name: bytes) -> bytes:
        return next((v for k, v in self.headers if k == name), b"")

    @property
    def at_eof(self) -> bool:
        return self.complete and not self._body

    async def read(self) -> bytes:
        while not self._body and not self.complete:
            await self._wait()
        out = b"".join(self._body)
        self._body.clear()
        return out

    async def pump(self, sink, drain) -> None:
        while self._body:
            sink(self._body.popleft())
        self._sink = sink
        while not self.complete:
            await self._wait()

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class InProcessPool:
    """The door's upstream pool over one ASGI app in this process."""

    def __init__(self, app):
        self.app = app

    async def request(self, method: str, url: str, headers: dict[str, str], body: bytes) -> InProcessReply:
        parts = urlsplit(url)
        reply = InProcessReply()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": parts.path, "raw_path": parts.path.encode(),
                 "query_string": parts.query.encode(), "root_path": "", "client": ("127.0.0.1", 0),
                 "server": ("127.0.0.1", 0),
                 "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]}
        reply.task = asyncio.ensure_future(self.app(scope, reply.receive_of(body), reply.send))
        await reply.started
        return reply

    async def close(self) -> None:
        pass
