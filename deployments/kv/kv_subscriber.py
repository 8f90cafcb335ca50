"""The front door's subscription to one engine's KV events, kept in the KV index
(routing/kv_index.py).

vLLM publishes them (`--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": ..., "replay_endpoint": ...}'`, vllm/distributed/kv_events.py `ZmqEventPublisher`):
on a PUB socket, one message per engine step, frames (topic, seq as 8 bytes big-endian, the
batch in msgpack); and on a ROUTER socket, a replay: ask with (b"", first seq) and get every
buffered batch from there as (b"", topic, seq, batch), then an end marker of seq -1.

`decode_batch` reads the msgpack as plain data (msgspec, as vLLM encodes it) rather than through
vLLM's classes: importing vLLM costs every front door about 18 s and 540 MB. A block hash is an
int, or bytes that are read as one big-endian int. Events of a tier the index does not keep
(vLLM's STORAGE) are dropped.

vLLM binds its PUB socket only on a wildcard or ipc endpoint (`tcp://*:5557`) and otherwise
connects it to the endpoint given, so either side may listen: `bind=True` listens here for an
engine configured with this address (the loopback tests; an engine on the door's node), else
this connects to an engine that listens. The replay endpoint always listens at the engine.

A PUB subscriber misses what was published before it connected, and whatever a full queue
dropped; the index notices either as a gap in the sequence numbers, and `KvSubscriber` asks the
replay endpoint for it. Where the engine no longer buffers the gap, the index is told
(`replay_failed`) and starts over from what it holds: it may then know less than the engine
holds, never more.

Not yet started by the front door (issue 24): the replicas do not pass `--kv-events-config` to
vLLM yet, and the door still routes on the hashes it sent to each replica (routing/prefix.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from hbmserve.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, KvEventBatch, Medium
from hbmserve.routing.kv_index import Gap, KvIndex

log = logging.getLogger("hbmserve.frontdoor")

END_SEQ = -1
REPLAY_TIMEOUT_S = 2.0
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


class KvSubscriber:
    """Keeps `index` up to date with one replica's engine. `run()` until cancelled."""

    def __init__(self, replica_id: str, endpoint: str, replay_endpoint: str | None, index: KvIndex,
                 topic: str = "", clock: Callable[[], float] = time.time, bind: bool = False) -> None:
        self.replica_id, self.endpoint, self.replay_endpoint = replica_id, endpoint, replay_endpoint
        self.bind = bind
        self.index, self.topic, self.clock = index, topic.encode(), clock
        self.dropped = 0  # unreadable messages

    async def run(self) -> None:
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        sub.setsockopt(zmq.LINGER, 0)
        sub.bind(self.endpoint) if self.bind else sub.connect(self.endpoint)
        try:
            while True:
                gap = self._take(*(await sub.recv_multipart())[-2:])
                if gap is not None:
                    await self.replay(gap)
        finally:
            sub.close()

    def _take(self, seq_bytes: bytes, payload: bytes) -> Gap | None:
        seq = int.from_bytes(seq_bytes, "big", signed=True)
        try:
            batch = decode_batch(self.replica_id, seq, payload)
        except KvEventsError:
            self.dropped += 1
            log.warning("dropped an unreadable KV event batch from %s", self.replica_id, exc_info=True)
            return None
        return self.index.apply(batch, self.clock())

    async def replay(self, gap: Gap) -> None:
        """Ask the engine for the batches from `gap.first_missing` on; what it cannot give is
        given up on (`replay_failed`)."""
        if self.replay_endpoint is None:
            self.index.replay_failed(self.replica_id, self.clock())
            return
        import zmq
        import zmq.asyncio

        dealer = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            await dealer.send_multipart([b"", gap.first_missing.to_bytes(8, "big")])
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), REPLAY_TIMEOUT_S)
                if int.from_bytes(frames[-2], "big", signed=True) == END_SEQ:
                    break
                self._take(frames[-2], frames[-1])
        except asyncio.TimeoutError:
            log.warning("KV event replay from %s timed out", self.replica_id)
        finally:
            dealer.close()
        self.index.replay_failed(self.replica_id, self.clock())  # a no-op once the gap is filled
