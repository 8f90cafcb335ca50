"""Which entries to evict so a new one fits: a pure decision over a snapshot of the cache.

Least recently used first, skipping every entry a replica holds a lease on or the warm pool has
pinned. It evicts nothing unless that makes the new entry fit: deleting a model and then failing
anyway would cost the next start its download for no gain. Two limits apply, the cache's cap and
the disk's free space (less a reserve), because the cache shares the disk with everything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class EntryState:
    key: str
    size_bytes: int
    last_used_s: float  # wall clock of the last hit or fill; only its order matters
    in_use: bool  # a lease is held by a live process
    pinned: bool  # kept for the warm pool

    @property
    def evictable(self) -> bool:
        return not (self.in_use or self.pinned)


@dataclass(frozen=True)
class CacheSnapshot:
    entries: tuple[EntryState, ...]
    reserved_bytes: int  # fills in progress elsewhere on the node, not yet published
    cap_bytes: int
    free_disk_bytes: int
    min_free_bytes: int


class Limit(str, Enum):
    CAP = "cap"  # the cache's max_gib
    DISK = "disk"  # the disk's free space less min_free_gib


@dataclass(frozen=True)
class EvictionPlan:
    fits: bool
    evict: tuple[str, ...]  # keys, least recently used first; empty when not `fits`
    reason: str
    blocked_by: Limit | None = None  # set when not `fits`: the limit that still does not hold


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"


def plan_eviction(snap: CacheSnapshot, need_bytes: int) -> EvictionPlan:
    used = sum(e.size_bytes for e in snap.entries) + snap.reserved_bytes
    # Bytes still to free for each limit; evicting an entry frees its size for both.
    over_cap = used + need_bytes - snap.cap_bytes
    over_disk = need_bytes + snap.min_free_bytes - snap.free_disk_bytes
    short = max(over_cap, over_disk)
    if short <= 0:
        return EvictionPlan(True, (), f"fits: {_gib(need_bytes)} needed, nothing to evict")
    evict, freed = [], 0
    for e in sorted((e for e in snap.entries if e.evictable), key=lambda e: (e.last_used_s, e.key)):
        if freed >= short:
            break
        evict.append(e.key)
        freed += e.size_bytes
    if freed >= short:
        return EvictionPlan(True, tuple(evict), f"evict {len(evict)} least recently used entries "
                            f"({_gib(freed)}) to make room for {_gib(need_bytes)}")
    held = [e for e in snap.entries if not e.evictable]
    blocked = Limit.CAP if over_cap >= over_disk else Limit.DISK
    limit = (f"the cap of {_gib(snap.cap_bytes)}" if blocked is Limit.CAP else
             f"the disk's free space ({_gib(snap.free_disk_bytes)} free, {_gib(snap.min_free_bytes)} kept free)")
    return EvictionPlan(False, (), f"{_gib(need_bytes)} does not fit under {limit} even after evicting every "
                        f"unused entry ({_gib(freed)}); held: {len(held)} entries in use or pinned "
                        f"({_gib(sum(e.size_bytes for e in held))}), {_gib(snap.reserved_bytes)} being filled",
                        blocked)
