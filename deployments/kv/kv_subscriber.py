"""The front door's subscription to one engine's KV events, kept in the KV index
(routing/kv_index.py), over the replica's HTTP port (kv_stream.py, engine_relay.py).

vLLM publishes a batch per engine step (vllm/distributed/kv_events.py `ZmqEventPublisher`):
msgpack of (ts, events[, data-parallel rank]); the replica relays each with its sequence number.

`decode_batch` reads the msgpack as plain data (msgspec, as vLLM encodes it) rather than through
vLLM's classes: importing vLLM costs every front door about 18 s and 540 MB. A block hash is an
int, or bytes that are read as one big-endian int. Events of a tier the index does not keep
(vLLM's STORAGE) are dropped.

A stream misses what was published before it joined: each new stream first asks the replica's
replay path for everything from batch 0, and a later gap in the sequence numbers is asked for
the same way. Where the engine no longer buffers the gap, the index is told (`replay_failed`) and starts
over from what it holds: it may then know less than the engine holds, never more. A stream that
breaks or goes silent (no heartbeat for `STALL_S`) makes the index forget the replica at once,
so the router falls back to load for it until the stream is back and replayed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from hbmserve.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, KvEventBatch, Medium
from hbmserve.deployments.kv.kv_stream import EVENTS_PATH, HEARTBEAT_SEQ, REPLAY_PATH, FrameReader, KvStreamError
from hbmserve.routing.kv_index import Gap, KvIndex

log = logging.getLogger("hbmserve.frontdoor")

STALL_S = 5.0  # a stream with no byte this long (heartbeats come each second) is given up
RECONNECT_S = 0.5
REPLAY_TIMEOUT_S = 5.0
_MEDIA = {None: Medium.HBM, "GPU": Medium.HBM, "CPU": Medium.HOST}


class KvEventsError(ValueError):
    """A message that is not a vLLM KV event batch."""


def _hash(h: int | bytes) -> int:
    return h if isinstance(h, int) else int.from_bytes(h, "big")


def _event(raw: dict) -> KvEvent | None:
    kind, medium = raw.get("type"), raw.get("medium")
    if medium not in _MEDIA:
        return None  # a tier the index does not keep
    if kind == "BlockStored":
        parent = raw.get("parent_block_hash")
        return BlockStored(tuple(map(_hash, raw["block_hashes"])), None if parent is None else _hash(parent),
                           _MEDIA[medium])
    if kind == "BlockRemoved":
        return BlockRemoved(tuple(map(_hash, raw["block_hashes"])), _MEDIA[medium])
    if kind == "AllBlocksCleared":
        return AllBlocksCleared(None if medium is None else _MEDIA[medium])
    raise KvEventsError(f"unknown KV event type {kind!r}")


def decode_batch(replica_id: str, seq: int, payload: bytes) -> KvEventBatch:
    """One published batch, as the index keeps it."""
    import msgspec

    try:
        raw = msgspec.msgpack.decode(payload)
        ts, events = float(raw[0]), raw[1]
        decoded = tuple(e for e in map(_event, events) if e is not None)
    except (msgspec.DecodeError, TypeError, KeyError, IndexError, ValueError, AttributeError) as err:
        raise KvEventsError(f"replica {replica_id}: KV event batch {seq} unreadable: {err}") from None
    return KvEventBatch(replica_id, seq, ts, decoded)


def encode_batch(ts: float, events: tuple[KvEvent, ...], block_size: int) -> bytes:
    """A batch as vLLM's publisher encodes it (msgpack of [ts, events, data-parallel rank], each
    event a map tagged by `type`), for an engine that is not vLLM (the simulated one) to publish
    what `decode_batch` and vLLM's own consumers read. Token ids are not known: sent empty."""
    import msgspec

    def one(e: KvEvent) -> dict:
        if isinstance(e, BlockStored):
            return {"type": "BlockStored", "block_hashes": list(e.hashes), "parent_block_hash": e.parent,
                    "token_ids": [], "block_size": block_size, "lora_id": None, "medium": e.medium.value,
                    "lora_name": None}
        if isinstance(e, BlockRemoved):
            return {"type": "BlockRemoved", "block_hashes": list(e.hashes), "medium": e.medium.value}
        return {"type": "AllBlocksCleared"} | ({} if e.medium is None else {"medium": e.medium.value})

    return msgspec.msgpack.encode([ts, [one(e) for e in events], None])


class KvSubscriber:
    """Keeps `index` up to date with one replica's engine. `run()` until cancelled (the replica
    left), which forgets the replica."""

    def __init__(self, replica_id: str, url: str, headers: dict[str, str], index: KvIndex,
                 session_of: Callable[[], Any], clock: Callable[[], float] = time.time) -> None:
        self.replica_id, self.url, self.headers = replica_id, url, headers
        self.index, self.session_of, self.clock = index, session_of, clock
        self.dropped = 0  # unreadable batches
        self.connected = False
        self.breaks = 0  # streams lost

    async def run(self) -> None:
        import aiohttp

        try:
            while True:
                try:
                    await self._stream()
                except (aiohttp.ClientError, asyncio.TimeoutError, KvStreamError, KvEventsError) as err:
                    if self.connected:
                        log.warning("KV events from %s lost (%s): routing on load there until they are back",
                                    self.replica_id, err or type(err).__name__)
                self.connected = False
                self.breaks += 1
                self.index.forget(self.replica_id)
                await asyncio.sleep(RECONNECT_S)
        finally:
            self.index.forget(self.replica_id)

    async def _stream(self) -> None:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=None, sock_connect=STALL_S, sock_read=STALL_S)
        async with self.session_of().get(self.url + EVENTS_PATH, headers=self.headers, timeout=timeout) as resp:
            if resp.status != 200:
                raise KvEventsError(f"replica {self.replica_id} answered {resp.status} for its KV events")
            self.connected = True
            # The index forgot this replica when its last stream ended (or never knew it): what
            # the engine still buffers brings it back to what the engine holds, with no need to
            # wait for new traffic to reveal the gap.
            await self.replay(0)
            reader = FrameReader()
            async for chunk in resp.content.iter_any():
                for seq, payload in list(reader.feed(chunk)):
                    if seq == HEARTBEAT_SEQ:
                        continue
                    gap = self._take(seq, payload)
                    if gap is not None:
                        await self.replay(gap.first_missing)
        raise KvStreamError("the replica ended its KV event stream")

    def _take(self, seq: int, payload: bytes) -> Gap | None:
        try:
            batch = decode_batch(self.replica_id, seq, payload)
        except KvEventsError:
            self.dropped += 1
            log.warning("dropped an unreadable KV event batch from %s", self.replica_id, exc_info=True)
            return None
        return self.index.apply(batch, self.clock())

    async def replay(self, first_missing: int) -> None:
        """Ask the replica for the batches from `first_missing` on; what it cannot give is
        given up on (`replay_failed`)."""
        import aiohttp

        try:
            async with self.session_of().get(f"{self.url}{REPLAY_PATH}?from={first_missing}", headers=self.headers,
                                             timeout=aiohttp.ClientTimeout(total=REPLAY_TIMEOUT_S)) as resp:
                if resp.status == 200:
                    for seq, payload in FrameReader().feed(await resp.read()):
                        self._take(seq, payload)
        except (aiohttp.ClientError, asyncio.TimeoutError, KvStreamError) as err:
            log.warning("KV event replay from %s failed: %s", self.replica_id, err or type(err).__name__)
        self.index.replay_failed(self.replica_id, self.clock())  # a no-op once the gap is filled
