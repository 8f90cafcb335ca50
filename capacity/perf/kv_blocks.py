"""Paged-KV bookkeeping: block arithmetic, the prefix cache keyed by trace hash ids, and the
host-memory tier behind it.

A trace's `hash_ids` name consecutive prompt blocks of `hash_block_tokens` tokens (Mooncake-style
traces use 512). A cached hash holds `blocks_per_hash` KV blocks. Entries referenced by running
requests are pinned; unreferenced ones stay cached (and count as free to the allocator) until the
allocator needs their blocks, then they are evicted least-recently-used first, as in vLLM.
A request releases its hashes last block first, so among equally old entries the tail of a
prefix goes before its head (vLLM frees blocks in reverse for the same reason): the cached set
stays prefix-closed for chained hashes, which the router's binary search relies on.

With `publish`, both tiers record what changed as vLLM's KV events (core/kv_events.py) in
`events`, for the caller to batch per step and hand to the KV index: the simulated engine
publishes what a real one would.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import KeysView, Sequence

from hbmserve.core.kv_events import BlockRemoved, BlockStored, KvEvent, Medium


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size) if tokens > 0 else 0


class HostTier:
    """A host-memory KV tier of `capacity` hashes, as vLLM's CPU offloading connector keeps one:
    write-through (every block the engine computes or reads is stored here too, so it holds
    HBM's blocks and those HBM has since evicted), least recently used out first."""

    def __init__(self, capacity: int, events: list[KvEvent] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"host tier capacity must be >= 1 hash, got {capacity}")
        self.capacity = capacity
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._events = events

    @property
    def cached(self) -> KeysView[int]:
        return self._lru.keys()

    def run_from(self, hashes: Sequence[int], start: int) -> int:
        """How many hashes from `start` on are held here, consecutively."""
        n = start
        while n < len(hashes) and hashes[n] in self._lru:
            n += 1
        return n - start

    def touch(self, hashes: Sequence[int]) -> None:
        """Store or refresh these hashes, last first, so a prefix's head is the newest."""
        new = [h for h in hashes if h not in self._lru]
        for h in reversed(hashes):
            self._lru[h] = None
            self._lru.move_to_end(h)
        gone = [self._lru.popitem(last=False)[0] for _ in range(len(self._lru) - self.capacity)]
        if self._events is not None:
            if new:
                self._events.append(BlockStored(tuple(new), None, Medium.HOST))
            if gone:
                self._events.append(BlockRemoved(tuple(gone), Medium.HOST))


class PrefixCache:
    def __init__(self, blocks_per_hash: int, host_hashes: int = 0, publish: bool = False) -> None:
        self.blocks_per_hash = blocks_per_hash
        self._refs: dict[int, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # unreferenced entries, oldest first
        self.hits = 0
        self.lookups = 0
        self.events: list[KvEvent] | None = [] if publish else None
        self.host = HostTier(host_hashes, self.events) if host_hashes else None

    @property
    def cached(self) -> KeysView[int]:
        """The cached hashes, a live read-only view (the router's `cached_prefixes`)."""
        return self._refs.keys()

    @property
    def total_blocks(self) -> int:
        return len(self._refs) * self.blocks_per_hash

    @property
    def evictable_blocks(self) -> int:
        return len(self._lru) * self.blocks_per_hash

    @property
    def referenced_blocks(self) -> int:
        return self.total_blocks - self.evictable_blocks

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading hashes are cached."""
        n = 0
        for h in hashes:
            if h not in self._refs:
                break
            n += 1
        return n

    def host_run(self, hashes: Sequence[int], hbm_hits: int) -> int:
        """How many hashes after the first `hbm_hits` the host tier can load, consecutively."""
        return self.host.run_from(hashes, hbm_hits) if self.host else 0

    def new_blocks_needed(self, hashes: Sequence[int]) -> int:
        return sum(self.blocks_per_hash for h in set(hashes) if h not in self._refs)

    def evictable_blocks_among(self, hashes: Sequence[int]) -> int:
        """Blocks of these hashes that are cached but unreferenced (pinning them makes them unevictable)."""
        return sum(self.blocks_per_hash for h in set(hashes) if h in self._lru)

    def acquire(self, hashes: Sequence[int]) -> int:
        """Pin every hash (creating the missing ones); returns the leading hits."""
        hits = self.match(hashes)
        self.lookups += len(hashes)
        self.hits += hits
        new: list[int] = []
        for h in hashes:
            refs = self._refs.get(h)
            if refs is None:
                new.append(h)
                refs = 0
            elif refs == 0:
                del self._lru[h]
            self._refs[h] = refs + 1
        if self.events is not None and new:
            i = hashes.index(new[0])
            self.events.append(BlockStored(tuple(new), hashes[i - 1] if i else None))
        if self.host is not None:
            self.host.touch(hashes)
        return hits

    def release(self, hashes: Sequence[int]) -> None:
        for h in reversed(hashes):
            refs = self._refs[h] - 1
            self._refs[h] = refs
            if refs == 0:
                self._lru[h] = None

    def evict(self, blocks: int) -> int:
        """Drop unreferenced entries, oldest first, until `blocks` are freed; returns blocks freed."""
        gone: list[int] = []
        while len(gone) * self.blocks_per_hash < blocks and self._lru:
            h, _ = self._lru.popitem(last=False)
            del self._refs[h]
            gone.append(h)
        if self.events is not None and gone:
            self.events.append(BlockRemoved(tuple(gone)))
        return len(gone) * self.blocks_per_hash
