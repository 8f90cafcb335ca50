"""plan_eviction: LRU order, never an entry in use or pinned, nothing evicted in vain.

Hand-worked cases first, then properties derived from the definition (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hbmserve.weights.eviction import CacheSnapshot, EntryState, Limit, plan_eviction

GIB = 1024**3


def entry(key: str, gib: float, used: float, *, in_use: bool = False, pinned: bool = False) -> EntryState:
    return EntryState(key, int(gib * GIB), used, in_use, pinned)


def snap(*entries: EntryState, cap_gib: float = 10, free_gib: float = 1000, min_free_gib: float = 0,
         reserved_gib: float = 0) -> CacheSnapshot:
    return CacheSnapshot(entries, int(reserved_gib * GIB), int(cap_gib * GIB), int(free_gib * GIB),
                         int(min_free_gib * GIB))


def test_room_left_evicts_nothing() -> None:
    plan = plan_eviction(snap(entry("a", 4, 1)), 6 * GIB)  # 4 + 6 = 10 = the cap
    assert plan.fits and plan.evict == ()


def test_least_recently_used_goes_first_and_only_as_many_as_needed() -> None:
    # 3 + 3 + 3 = 9 GiB held, cap 10, need 4: 2 GiB short, so only the oldest (c, used at t=1) goes.
    s = snap(entry("a", 3, 5), entry("b", 3, 3), entry("c", 3, 1))
    assert plan_eviction(s, 4 * GIB).evict == ("c",)
    # need 7: 6 short, c then b.
    assert plan_eviction(s, 7 * GIB).evict == ("c", "b")


def test_in_use_and_pinned_are_skipped_even_when_oldest() -> None:
    s = snap(entry("old-leased", 3, 1, in_use=True), entry("old-pinned", 3, 2, pinned=True), entry("new", 3, 9))
    plan = plan_eviction(s, 4 * GIB)
    assert plan.fits and plan.evict == ("new",)


def test_nothing_is_evicted_when_it_would_not_make_room() -> None:
    s = snap(entry("leased", 6, 1, in_use=True), entry("free", 2, 2))
    plan = plan_eviction(s, 5 * GIB)  # 6 held for good + 5 > 10 whatever goes
    assert not plan.fits and plan.evict == () and plan.blocked_by is Limit.CAP
    assert "in use or pinned" in plan.reason


def test_the_disk_can_bind_before_the_cap() -> None:
    # Cap has room (10 - 2 >= 3) but the disk has 4 GiB free and 2 must stay free: 1 short.
    s = snap(entry("a", 2, 1), cap_gib=10, free_gib=4, min_free_gib=2)
    plan = plan_eviction(s, 3 * GIB)
    assert plan.fits and plan.evict == ("a",)
    plan = plan_eviction(snap(entry("a", 2, 1, pinned=True), free_gib=4, min_free_gib=2), 3 * GIB)
    assert not plan.fits and plan.blocked_by is Limit.DISK


def test_fills_in_progress_count_against_the_cap() -> None:
    plan = plan_eviction(snap(entry("a", 2, 1), reserved_gib=6), 3 * GIB)  # 2 + 6 + 3 = 11 > 10
    assert plan.evict == ("a",)


states = st.lists(st.builds(EntryState, key=st.text("abcdef", min_size=1, max_size=4),
                            size_bytes=st.integers(0, 50), last_used_s=st.floats(0, 100),
                            in_use=st.booleans(), pinned=st.booleans()),
                  max_size=8, unique_by=lambda e: e.key)


@settings(max_examples=300, deadline=None)
@given(states, st.integers(0, 120), st.integers(0, 200), st.integers(0, 400), st.integers(0, 40), st.integers(0, 60))
def test_properties(entries, need, cap, free, min_free, reserved) -> None:
    s = CacheSnapshot(tuple(entries), reserved, cap, free, min_free)
    plan = plan_eviction(s, need)
    by_key = {e.key: e for e in entries}
    gone = [by_key[k] for k in plan.evict]

    def fits_after(removed: list[EntryState]) -> bool:
        freed = sum(e.size_bytes for e in removed)
        used = sum(e.size_bytes for e in entries) + reserved - freed
        return used + need <= cap and free + freed - need >= min_free

    assert all(e.evictable for e in gone)  # never in use, never pinned
    if not plan.fits:
        assert plan.evict == () and not fits_after([e for e in entries if e.evictable])
        return
    assert fits_after(gone)
    # LRU: what goes is a prefix of the evictable entries by last use...
    order = sorted((e for e in entries if e.evictable), key=lambda e: (e.last_used_s, e.key))
    assert gone == order[: len(gone)]
    # ...and a minimal one: keeping the last of them would not fit.
    if gone:
        assert not fits_after(gone[:-1])
