"""Paged-KV bookkeeping: block arithmetic and the prefix cache keyed by trace hash ids.

A trace's `hash_ids` name consecutive prompt blocks of `hash_block_tokens` tokens (Mooncake-style
traces use 512). A cached hash holds `blocks_per_hash` KV blocks. Entries referenced by running
requests are pinned; unreferenced ones stay cached (and count as free to the allocator) until the
allocator needs their blocks, then they are evicted least-recently-used first, as in vLLM.
A request releases its hashes last block first, so among equally old entries the tail of a
prefix goes before its head (vLLM frees blocks in reverse for the same reason): the cached set
stays prefix-closed for chained hashes, which the router's binary search relies on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import KeysView, Sequence


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size) if tokens > 0 else 0


class PrefixCache:
    def __init__(self, blocks_per_hash: int) -> None:
        self.blocks_per_hash = blocks_per_hash
        self._refs: dict[int, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # unreferenced entries, oldest first
        self.hits = 0
        self.lookups = 0

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
        for h in hashes:
            refs = self._refs.get(h, 0)
            if refs == 0:
                self._lru.pop(h, None)
            self._refs[h] = refs + 1
        return hits

    def release(self, hashes: Sequence[int]) -> None:
        for h in reversed(hashes):
            refs = self._refs[h] - 1
            self._refs[h] = refs
            if refs == 0:
                self._lru[h] = None

    def evict(self, blocks: int) -> int:
        """Drop unreferenced entries, oldest first, until `blocks` are freed; returns blocks freed."""
        freed = 0
        while freed < blocks and self._lru:
            h, _ = self._lru.popitem(last=False)
            del self._refs[h]
            freed += self.blocks_per_hash
        return freed
