"""What the simulated router knows of each replica's prefix cache, from one of two sources
(core/routing.py PrefixSource), kept apart from the cluster simulator's event loop:

- EVENTS: every engine step's KV events (the simulated engine publishes what vLLM's
  --kv-events-config would) go as one numbered batch to the KV index (kvindex/index.py), the
  same index the live front door keeps; `lag_s` delays their arrival, as a subscriber behind
  the stream would see them.
- ROUTED: the hashes last routed to each replica, as many as its HBM holds (routing/prefix.py
  RecentPrefixes), the approximate fallback the live door uses without events. Each front door
  remembers only what it routed itself: with `doors` > 1 (one door per node, clients spread over
  them) a door is blind to what the others sent, as a live door is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Set
from typing import Any

from hbmserve.core.kv_events import KvEvent, KvEventBatch
from hbmserve.core.routing import PrefixSource
from hbmserve.routing.kv_index import KvIndex
from hbmserve.routing.prefix import RecentPrefixes

_EMPTY: frozenset[int] = frozenset()


class SimKvView:
    def __init__(self, source: PrefixSource, lag_s: float, routed_capacity: int, doors: int = 1) -> None:
        if doors < 1:
            raise ValueError(f"doors must be >= 1, got {doors}")
        self.source, self.lag_s, self.routed_capacity, self.doors = source, lag_s, routed_capacity, doors
        self.index = KvIndex() if source is PrefixSource.EVENTS else None
        self._in_flight: deque[KvEventBatch] = deque()  # published, not yet at the index
        self._seq: dict[str, int] = {}
        self._routed: dict[tuple[int, str], RecentPrefixes] = {}  # (door, replica) -> what it sent there

    def published(self, rid: str, events: tuple[KvEvent, ...], now: float) -> None:
        if self.index is None or not events:
            return
        seq = self._seq.get(rid, 0)
        self._seq[rid] = seq + 1
        batch = KvEventBatch(rid, seq, now, events)
        if self.lag_s > 0:
            self._in_flight.append(batch)
        else:
            self.index.apply(batch, now)

    def routed(self, rid: str, hashes: tuple[int, ...], door: int = 0) -> None:
        if self.source is PrefixSource.ROUTED and hashes:
            self._routed.setdefault((door, rid), RecentPrefixes(self.routed_capacity)).remember(hashes)

    def forget(self, rid: str) -> None:
        for door in range(self.doors):
            self._routed.pop((door, rid), None)
        if self.index is not None:
            self.index.forget(rid)

    def sets(self, rid: str, now: float, door: int = 0) -> tuple[Set[int], Set[int]]:
        """(HBM hashes, host-tier hashes) the router at `door` may assume `rid` holds at `now`."""
        if self.index is None:
            mem: Any = self._routed.get((door, rid))
            return (mem.keys() if mem is not None else _EMPTY), _EMPTY
        while self._in_flight and self._in_flight[0].ts + self.lag_s <= now:
            batch = self._in_flight.popleft()
            self.index.apply(batch, batch.ts + self.lag_s)  # as of its arrival
        kv = self.index.view(rid)
        return (kv.hbm, kv.host) if kv.trusted else (_EMPTY, _EMPTY)
