"""The simulated engine's KV events, published as a vLLM replica publishes them, so that the front
doors route a cluster of `engine: sim` replicas by what each holds, through the same subscriber,
index and `choose` as a vLLM cluster (deployments/kv).

vLLM's publisher numbers each engine step's batch from 0, keeps the last `buffer_steps` for
replay, and a subscriber that falls behind loses batches (ZMQ's high-water mark) and sees a gap.
`SimKvPublisher` does the same in process: every step's events become one batch (encoded as
vLLM encodes it, kv_subscriber.encode_batch), each connected door has a bounded queue that drops
what does not fit, and the replay path serves the buffer. The block hashes are the simulated
engine's own (HASHING_TEXT: the prompt's text in 64-character blocks), which a door computes
from the request without a tokenizer.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from hbmserve.core.kv_events import KvEvent
from hbmserve.deployments.kv.kv_stream import Batch, serve_events, serve_replay
from hbmserve.deployments.kv.kv_subscriber import encode_batch

BUFFER_STEPS = 10_000  # vLLM's default replay buffer
QUEUE_BATCHES = 1_000  # per door; past it a batch is dropped for that door, which replays the gap


class SimKvPublisher:
    def __init__(self, block_size: int, buffer_steps: int = BUFFER_STEPS, queue_batches: int = QUEUE_BATCHES,
                 clock: Callable[[], float] = time.time) -> None:
        self.block_size, self.clock, self.queue_batches = block_size, clock, queue_batches
        self.seq = 0
        self.buffer: deque[Batch] = deque(maxlen=buffer_steps)
        self._doors: set[asyncio.Queue[Batch]] = set()
        self.dropped = 0  # batches a full door queue did not take

    @property
    def streams(self) -> int:
        return len(self._doors)

    def publish(self, events: tuple[KvEvent, ...]) -> None:
        """One engine step's events as the next batch; a step that changed nothing sends none."""
        if not events:
            return
        batch = (self.seq, encode_batch(self.clock(), events, self.block_size))
        self.seq += 1
        self.buffer.append(batch)
        for q in self._doors:
            try:
                q.put_nowait(batch)
            except asyncio.QueueFull:
                self.dropped += 1

    async def events(self, scope, receive, send) -> None:
        q: asyncio.Queue[Batch] = asyncio.Queue(self.queue_batches)

        async def next_batch(timeout_s: float) -> Batch | None:
            try:
                return await asyncio.wait_for(q.get(), timeout_s)
            except asyncio.TimeoutError:
                return None

        self._doors.add(q)
        try:
            await serve_events(receive, send, next_batch)
        finally:
            self._doors.discard(q)

    async def replay(self, scope, receive, send) -> None:
        async def batches_from(start: int) -> list[Batch]:
            return [b for b in self.buffer if b[0] >= start]

        await serve_replay(scope, send, batches_from)
