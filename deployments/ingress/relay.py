"""One request relayed from the front door to one replica, and back, byte for byte.

The response's status and headers are held back until the replica's first body byte arrives:
until then nothing has reached the client, so a replica that dies (connection refused or reset,
closed before answering) is a `NotStarted` failure the caller retries once on another replica.
After the first byte, a failure ends the stream: a server-sent-event stream gets a terminal
`data: {"error": ...}` event, so an OpenAI client raises instead of silently stopping short;
unless the stream has a `StreamLedger` that can resume it (migration.py): then the response is
left open (`Relayed.left_open`) for the front door to go on from another replica, whose reply
`relay(..., resumed=True)` streams into the same response.
A client that goes away cancels the upstream request, which frees the engine's slot.
Once a stream's first piece is out, the rest is pumped: each piece goes from the replica's
socket callback to the client's socket (`send.push`, wire/chunk_push.py) with the same ledger
and tap on the way, and no task wake-up per piece.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from hbmserve.deployments.ingress.migration import StreamLedger
from hbmserve.deployments.ingress.usage_tap import UsageTap
from hbmserve.deployments.wire.http import ADAPTER_HEADER, INTERNAL_TOKEN_HEADER
from hbmserve.deployments.wire.upstream import UpstreamPool

_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"host", b"upgrade", b"te",
                         b"trailer", b"proxy-authorization", b"proxy-connection", b"content-length",
                         b"authorization", INTERNAL_TOKEN_HEADER})
# The door's listener writes its own date (a second one would break a singleton field) and
# names no server.
_RESPONSE_DROP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"trailer", b"date",
                            b"server"})


class NotStarted(Exception):
    """The replica failed before the client got any byte: safe to retry elsewhere."""


class Refused(NotStarted):
    """The replica answered a continuation with an error (at its cap, say): it is alive."""


class FirstByteTimeout(Exception):
    """The replica accepted the request but sent nothing within the first-byte timeout."""


@dataclass(frozen=True)
class Relayed:
    status: int
    first_byte_s: float | None  # None when the reply had no body
    completed: bool  # False: the stream broke after it started
    left_open: bool = False  # broken, resumable, and the client's response not ended yet


def upstream_headers(client_headers: list[tuple[bytes, bytes]], token: str, adapter: str | None = None) -> dict[str, str]:
    """The client's headers for the replica, less hop-by-hop ones and any x-hbmserve-* a client
    sent (those are the door's word to the replica), plus the internal token and the adapter."""
    out = {k.decode("latin-1"): v.decode("latin-1") for k, v in client_headers
           if k.lower() not in _HOP_BY_HOP and not k.lower().startswith(b"x-hbmserve-")}
    out[INTERNAL_TOKEN_HEADER.decode()] = token
    if adapter is not None:
        out[ADAPTER_HEADER.decode()] = adapter
    return out


def sse_error_event(message: str) -> bytes:
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": "replica_failed"}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


REPLICA_HEADER = b"x-hbmserve-replica"


async def relay(pool: UpstreamPool, url: str, method: str, headers: dict[str, str], body: bytes, send,
                first_byte_timeout_s: float, started_at: float, replica: str = "",
                tap: UsageTap | None = None, ledger: StreamLedger | None = None, resumed: bool = False,
                streams: set | None = None) -> Relayed:
    """Send the request to `url` over `pool` (wire/upstream.py) and stream the reply to the ASGI
    `send`; the reply names the replica that served it (`x-hbmserve-replica`), for the client's
    and the operator's logs.
    `tap` reads the engine's usage on the way (usage_tap.py); `ledger` keeps a stream resumable
    (migration.py). `resumed`: the reply continues a response already started, so it sends no
    status line; a continuation that is refused (not a 200) is a break. `streams`: the replica's
    set of replies in flight, which the replica table closes when it finds the replica gone."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + first_byte_timeout_s  # for the status line and the first body byte
    try:  # timeout_at, not wait_for: no task of its own for each wait
        async with asyncio.timeout_at(deadline):
            resp = await pool.request(method, url, headers, body)
    except TimeoutError:
        raise FirstByteTimeout() from None
    except OSError as err:
        raise NotStarted(f"{type(err).__name__}: {err}") from None
    if streams is not None:
        streams.add(resp)
    try:
        try:
            async with asyncio.timeout_at(deadline):
                first = await resp.read()
        except TimeoutError:
            raise FirstByteTimeout() from None
        except OSError as err:
            raise NotStarted(f"{type(err).__name__}: {err}") from None
        first_at = loop.time() - started_at if first else None
        is_sse = resp.header(b"content-type").startswith(b"text/event-stream")
        tap = tap or UsageTap(strip=False)
        if resumed:
            if resp.status != 200 or not is_sse:
                raise Refused(f"the continuation was answered {resp.status}")
        else:
            out_headers = [(k, v) for k, v in resp.headers
                           if k not in _RESPONSE_DROP and not (is_sse and k == b"content-length")]
            if replica:
                out_headers.append((REPLICA_HEADER, replica.encode()))
            tap.begin(resp.status, is_sse)
            await send({"type": "http.response.start", "status": resp.status, "headers": out_headers})
        if not (is_sse and resp.status == 200):
            ledger = None  # an error reply: passed on as it is
        pass_on = (ledger.feed_continued if resumed else ledger.feed) if ledger is not None else None
        push = getattr(send, "push", None) if is_sse else None
        try:
            chunk = first
            while chunk:
                if pass_on is not None:
                    chunk = pass_on(chunk)
                if chunk:
                    await send({"type": "http.response.body", "body": tap.feed(chunk), "more_body": True})
                if ledger is not None and ledger.failed:
                    raise ConnectionResetError("the engine sent an error event")
                if push is not None and push.usable:  # the reply has started: the rest goes straight on
                    await resp.pump(_pushing(push, pass_on, tap, ledger), push.drain)
                    break
                chunk = await resp.read()
        except OSError as err:
            if ledger is not None and ledger.finished:  # every token is out: end the stream as it would have
                await send({"type": "http.response.body", "body": tap.feed(ledger.closing()) + tap.finish()})
                return Relayed(resp.status, first_at, completed=True)
            if ledger is not None and ledger.can_resume:
                return Relayed(resp.status, first_at, completed=False, left_open=True)
            await end_broken(send, tap, is_sse, f"the replica serving this request failed mid-stream "
                             f"({type(err).__name__}); the reply is incomplete")
            return Relayed(resp.status, first_at, completed=False)
        await send({"type": "http.response.body", "body": tap.finish()})
        return Relayed(resp.status, first_at, completed=True)
    finally:
        if streams is not None:
            streams.discard(resp)
        resp.release()


def _pushing(push, pass_on, tap: UsageTap, ledger: StreamLedger | None):
    """The sink for `UpstreamResponse.pump`: each piece as the loop above treats it, written
    with the client's push (wire/chunk_push.py)."""
    def sink(chunk: bytes) -> bool:
        if pass_on is not None:
            chunk = pass_on(chunk)
        more = push.write(tap.feed(chunk)) if chunk else True
        if ledger is not None and ledger.failed:
            raise ConnectionResetError("the engine sent an error event")
        return more
    return sink


async def end_broken(send, tap: UsageTap, is_sse: bool, message: str) -> None:
    """End a response whose reply broke: what the tap still holds, then an SSE error event."""
    await send({"type": "http.response.body", "body": tap.finish() + (sse_error_event(message) if is_sse else b"")})


async def while_connected(receive, work):
    """`work`'s result (a queue's ticket, a relay), unless the client goes away first: then it is
    cancelled (None), which gives back a queued place at once, and closes a relay's upstream
    connection so that the engine aborts the request instead of generating for nobody.
    `work` runs in the request's own task, which the watch cancels: one task a request fewer,
    and no `asyncio.wait` (issue 22)."""
    me = asyncio.current_task()
    left = over = False

    def cancel() -> None:
        nonlocal left
        if not over:
            left = True
            me.cancel()

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        # A turn of the loop's grace: work that finishes as the client leaves keeps its result
        # (uvicorn reports a finished reply as a disconnect too).
        asyncio.get_running_loop().call_soon(cancel)

    watch = asyncio.ensure_future(disconnected())
    try:
        return await work
    except asyncio.CancelledError:
        if not left:  # cancelled from outside (a shutdown): not ours to swallow
            raise
        return None
    finally:
        over = True
        watch.cancel()
        if left:
            me.uncancel()
