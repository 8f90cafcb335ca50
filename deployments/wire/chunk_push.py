"""A streamed reply's body written to the client's socket where each piece arrives, without an
ASGI message and a coroutine per piece.

The front door relays every token of every stream: one piece from the replica, one piece to
the client. Through ASGI that is a future resolved by the replica's socket, the relay's task
woken on the next loop turn, and a `send` coroutine (one per wrapper: the dashboard's timing,
an adapter's meter) down to uvicorn's write. With a `ChunkPush` the replica's socket callback
(wire/upstream.py `pump`) writes the piece to the client in the same call. That measured 15-21%
less of the door's CPU per streamed token (docs/benchmarks.md, issue 22).

Only a reply's middle goes this way. Its start and its end still go through ASGI `send`, so
uvicorn's state (started, complete, keep-alive) and every wrapper's view of the reply stay as
they were; a wrapper that reads the body sees the pushed pieces through `ObservedPush`.

The listener (wire/hardened_http.py) offers one per request in the scope's extensions, under
PUSH_EXTENSION; `pushing(send, scope)` gives the app a `send` that carries it.
"""

from __future__ import annotations

from typing import Callable

PUSH_EXTENSION = "hbmserve.push"


class ChunkPush:
    """Writes body pieces of one chunked reply on uvicorn's request cycle."""

    __slots__ = ("_cycle",)

    def __init__(self, cycle):
        self._cycle = cycle

    @property
    def usable(self) -> bool:
        """The reply has started, in chunked encoding, and has not ended: pieces may be pushed."""
        c = self._cycle
        return c.response_started and c.chunked_encoding is True and not c.response_complete

    def write(self, body: bytes) -> bool:
        """Send `body` as one chunk. False: the client's socket buffer is past its high-water
        mark, so the caller stops reading its source until `drain()` returns."""
        c = self._cycle
        if c.disconnected:  # dropped, as uvicorn's send drops it; the app hears of the disconnect
            return True
        if body:
            c.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return not c.flow.write_paused

    async def drain(self) -> None:
        c = self._cycle
        if c.flow.write_paused and not c.disconnected:
            await c.flow.drain()  # uvicorn resumes it on a lost connection too


class ObservedPush:
    """A push that shows each piece to `observe` first: a `send` wrapper's view of the body."""

    __slots__ = ("_inner", "_observe")

    def __init__(self, inner, observe: Callable[[bytes], None]):
        self._inner, self._observe = inner, observe

    @property
    def usable(self) -> bool:
        return self._inner.usable

    def write(self, body: bytes) -> bool:
        self._observe(body)
        return self._inner.write(body)

    async def drain(self) -> None:
        await self._inner.drain()


class PushingSend:
    """An ASGI `send` that also carries the reply's push (`send.push`)."""

    __slots__ = ("_send", "push")

    def __init__(self, send, push):
        self._send, self.push = send, push

    async def __call__(self, message) -> None:
        await self._send(message)


def pushing(send, scope):
    """`send`, with the listener's push for this request when it offers one."""
    push = scope.get("extensions", {}).get(PUSH_EXTENSION)
    return send if push is None else PushingSend(send, push)
