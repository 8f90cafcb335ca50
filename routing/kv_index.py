"""The KV index of one model: which block hashes each replica's engine holds, per tier, kept
from the engines' own KV events (core/kv_events.py) rather than from where requests were sent.

Pure bookkeeping: batches come in with `now`, views go out; the adapter that reads the ZMQ
stream (or the simulator, which publishes the same events) does the I/O, including the replay
the index asks for.

Why each rule:
- A batch's sequence number is the only way to know an event was lost. A batch after a gap is
  held, the replica's view is distrusted (the router treats it as holding nothing, so load
  decides), and `apply` returns the `Gap` to replay. Replayed batches go through `apply` like any
  other; once the gap is filled the held ones follow and the view is trusted again. If the
  replay cannot fill it (the engine's buffer is shorter than the gap, `replay_failed`), the view
  is cleared and rebuilt from the held batches on: it then knows less than the engine holds,
  never more, so it can miss a hit but never send a request to a replica that lacks the blocks.
- A first batch with seq > 0 means the subscriber joined late (or the index restarted): the
  same gap, from 0, so the adapter catches up through the replay endpoint.
- Lag: a batch that arrives more than `max_lag_s` after the engine published it means the
  subscriber is behind; the replica's view is distrusted until a batch arrives in time.
- Memory is bounded per replica and tier (`max_hashes`): past it, the hashes stored longest ago
  go first (counted as `overflowed`), which an engine that never reports removals (lost events)
  would otherwise grow without end. The engine's own capacity is far below the default.
- `forget` drops a replica at once (it died, or left the model): nothing is routed on its view.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from hbmserve.core.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored, KvEventBatch, Medium,
                                     ReplicaKv)

DEFAULT_MAX_LAG_S = 2.0
DEFAULT_MAX_HASHES = 1 << 21  # per replica and tier: 2 M hashes, ~200 MB of dict at worst
DEFAULT_MAX_HELD = 1024  # batches held while a gap waits for replay


@dataclass(frozen=True)
class IndexLimits:
    max_lag_s: float = DEFAULT_MAX_LAG_S
    max_hashes: int = DEFAULT_MAX_HASHES
    max_held_batches: int = DEFAULT_MAX_HELD

    def __post_init__(self) -> None:
        if not (self.max_lag_s > 0 and self.max_hashes >= 1 and self.max_held_batches >= 1):
            raise ValueError("max_lag_s must be > 0, max_hashes and max_held_batches >= 1")


@dataclass(frozen=True)
class Gap:
    """Batches [first_missing, next_held) of a replica are missing: replay them."""

    replica_id: str
    first_missing: int
    next_held: int


@dataclass(frozen=True)
class IndexStats:
    replicas: int
    hbm_hashes: int
    host_hashes: int
    batches: int  # applied
    stale_batches: int  # duplicates or older than applied: ignored
    gaps: int
    resets: int  # gaps replay could not fill: view cleared
    overflowed: int  # hashes dropped by the memory bound
    distrusted: tuple[str, ...]  # replicas whose view the router ignores now
    max_lag_s: float  # the largest lag of the replicas' last batches


@dataclass
class _Replica:
    hbm: OrderedDict[int, None] = field(default_factory=OrderedDict)
    host: OrderedDict[int, None] = field(default_factory=OrderedDict)
    next_seq: int | None = None  # None: no batch seen yet
    held: dict[int, KvEventBatch] = field(default_factory=dict)
    lag_s: float = 0.0

    def tier(self, medium: Medium) -> OrderedDict[int, None]:
        return self.hbm if medium is Medium.HBM else self.host


class KvIndex:
    def __init__(self, limits: IndexLimits = IndexLimits()) -> None:
        self.limits = limits
        self._replicas: dict[str, _Replica] = {}
        self._batches = self._stale = self._gaps = self._resets = self._overflowed = 0

    # ---- events in ----
    def apply(self, batch: KvEventBatch, now: float) -> Gap | None:
        """Take one batch (live, held or replayed); returns the gap to replay when one opens."""
        r = self._replicas.setdefault(batch.replica_id, _Replica())
        expected = 0 if r.next_seq is None else r.next_seq
        if batch.seq < expected or batch.seq in r.held:
            self._stale += 1
            return None
        if batch.seq > expected:
            opens = not r.held
            r.held[batch.seq] = batch
            if len(r.held) > self.limits.max_held_batches:
                self.replay_failed(batch.replica_id, now)
                return None
            if opens:
                self._gaps += 1
                return Gap(batch.replica_id, expected, batch.seq)
            return None
        self._apply(r, batch, now)
        while r.next_seq in r.held:
            self._apply(r, r.held.pop(r.next_seq), now)
        return None

    def replay_failed(self, replica_id: str, now: float) -> None:
        """The gap cannot be replayed: clear the view and carry on from the held batches."""
        r = self._replicas.get(replica_id)
        if r is None or not r.held:
            return
        self._resets += 1
        r.hbm.clear()
        r.host.clear()
        r.next_seq = min(r.held)
        while r.next_seq in r.held:
            self._apply(r, r.held.pop(r.next_seq), now)
        r.held.clear()  # a second gap inside the held ones: what follows is cleared anyway

    def forget(self, replica_id: str) -> None:
        self._replicas.pop(replica_id, None)

    def _apply(self, r: _Replica, batch: KvEventBatch, now: float) -> None:
        self._batches += 1
        r.next_seq = batch.seq + 1
        r.lag_s = max(0.0, now - batch.ts)
        cap = self.limits.max_hashes
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                d = r.tier(ev.medium)
                for h in ev.hashes:
                    d[h] = None
                    d.move_to_end(h)
                while len(d) > cap:
                    d.popitem(last=False)
                    self._overflowed += 1
            elif isinstance(ev, BlockRemoved):
                d = r.tier(ev.medium)
                for h in ev.hashes:
                    d.pop(h, None)
            elif isinstance(ev, AllBlocksCleared):
                for medium in (Medium.HBM, Medium.HOST) if ev.medium is None else (ev.medium,):
                    r.tier(medium).clear()

    # ---- views out ----
    def view(self, replica_id: str) -> ReplicaKv:
        """What the router may assume this replica holds (live views of the index)."""
        r = self._replicas.get(replica_id)
        if r is None:
            return ReplicaKv(trusted=False, why="no KV events from this replica yet")
        if r.held:
            return ReplicaKv(trusted=False, why=f"missed KV events from batch {r.next_seq}; replaying")
        if r.lag_s > self.limits.max_lag_s:
            return ReplicaKv(trusted=False, why=f"KV events {r.lag_s:.1f} s behind (bound {self.limits.max_lag_s:g} s)")
        return ReplicaKv(r.hbm.keys(), r.host.keys())

    def stats(self) -> IndexStats:
        rs = self._replicas
        return IndexStats(
            replicas=len(rs), hbm_hashes=sum(len(r.hbm) for r in rs.values()),
            host_hashes=sum(len(r.host) for r in rs.values()), batches=self._batches,
            stale_batches=self._stale, gaps=self._gaps, resets=self._resets, overflowed=self._overflowed,
            distrusted=tuple(sorted(k for k in rs if not self.view(k).trusted)),
            max_lag_s=max((r.lag_s for r in rs.values()), default=0.0))
