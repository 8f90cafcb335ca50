"""The KV event stream between a replica and a front door: two paths behind the internal token,
and the frames they carry.

A replica relays its engine's KV event batches (engine_relay.py) on
- `GET /hbm/kv/events`: a streamed reply that lasts until either side leaves, one frame per
  batch as the engine publishes it, and a heartbeat frame each `HEARTBEAT_S` while idle, so the
  door notices a silent stream;
- `GET /hbm/kv/replay?from=N`: the batches from seq N on that the engine still buffers, as one
  reply of frames.
A frame is the batch's sequence number (8 bytes, big-endian, signed), its length (4 bytes) and
the batch as vLLM encodes it (msgpack, kv_subscriber.decode_batch); the heartbeat has sequence
number -2 and no batch.

Why over the replica's HTTP port and not the engine's ZMQ sockets: the engine's sockets have no
authentication and vLLM binds a network one only on a wildcard address (`tcp://*:PORT`), which
would put every replica's cache contents (hashes of what its users sent) on every interface.
The engine binds local `ipc://` sockets instead and the replica, which the doors already reach
with the internal token, relays them; a door keeps one such stream per replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from urllib.parse import parse_qs

EVENTS_PATH = "/hbm/kv/events"
REPLAY_PATH = "/hbm/kv/replay"
TOKENIZER_PATH = "/hbm/tokenizer"  # the model's tokenizer files, for the doors (prompt_tokens.py)
HEARTBEAT_SEQ = -2
HEARTBEAT_S = 1.0
_HEAD = 12
MAX_FRAME_BYTES = 64 << 20  # a batch is an engine step's events: far below this


class KvStreamError(ValueError):
    """Bytes that are not KV event frames."""


def frame(seq: int, payload: bytes = b"") -> bytes:
    return seq.to_bytes(8, "big", signed=True) + len(payload).to_bytes(4, "big") + payload


def heartbeat() -> bytes:
    return frame(HEARTBEAT_SEQ)


class FrameReader:
    """Frames out of a byte stream read in arbitrary pieces."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[tuple[int, bytes]]:
        """Every whole frame `data` completes, as (seq, payload); heartbeats included."""
        self._buf += data
        while len(self._buf) >= _HEAD:
            size = int.from_bytes(self._buf[8:12], "big")
            if size > MAX_FRAME_BYTES:
                raise KvStreamError(f"a KV event frame of {size} bytes (limit {MAX_FRAME_BYTES})")
            if len(self._buf) < _HEAD + size:
                return
            seq = int.from_bytes(self._buf[:8], "big", signed=True)
            payload = bytes(self._buf[_HEAD:_HEAD + size])
            del self._buf[:_HEAD + size]
            yield seq, payload

    @property
    def pending(self) -> int:
        return len(self._buf)


# ---- the replica's side: two ASGI handlers over any source of batches ----
Batch = tuple[int, bytes]  # (seq, the batch as vLLM encodes it)


async def serve_events(receive, send, next_batch: Callable[[float], Awaitable[Batch | None]]) -> None:
    """`GET /hbm/kv/events`: a frame for each batch `next_batch(timeout_s)` returns, a heartbeat
    when it returns None (nothing within the timeout), until the door disconnects."""
    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/octet-stream"), (b"cache-control", b"no-store")]})
        while not gone.is_set():
            batch = await next_batch(HEARTBEAT_S)
            out = heartbeat() if batch is None else frame(*batch)
            if not gone.is_set():
                await send({"type": "http.response.body", "body": out, "more_body": True})
    finally:
        watcher.cancel()


async def serve_replay(scope, send, batches_from: Callable[[int], Awaitable[list[Batch]]]) -> None:
    """`GET /hbm/kv/replay?from=N`: the batches from seq N on that the source still buffers."""
    start = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("from", [""])[0]
    # Only doors call this, with the internal token: no OpenAI error shape needed. A sequence
    # number is a signed 64-bit one (vLLM's), so a larger one is refused rather than overflow.
    if not (start.isdigit() and int(start) < 1 << 63):
        await send({"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"replay needs ?from=<first sequence number>"})
        return
    body = b"".join(frame(seq, payload) for seq, payload in await batches_from(int(start)))
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/octet-stream"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
