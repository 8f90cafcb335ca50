"""The KV index (kvindex/index.py): kept from events, distrusted on gaps and lag, bounded, and
never ahead of what the engine held once events are lost."""

from __future__ import annotations

import random

import pytest

from hbmserve.capacity.perf.kv_blocks import PrefixCache
from hbmserve.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEventBatch, Medium
from hbmserve.routing.kv_index import Gap, IndexLimits, KvIndex


def batch(seq: int, *events, ts: float = 0.0, rid: str = "r0") -> KvEventBatch:
    return KvEventBatch(rid, seq, ts, tuple(events))


def test_stored_and_removed_blocks_make_the_view_per_tier():
    ix = KvIndex()
    ix.apply(batch(0, BlockStored((1, 2, 3)), BlockStored((7,), medium=Medium.HOST)), now=0.0)
    ix.apply(batch(1, BlockRemoved((3,))), now=0.0)
    kv = ix.view("r0")
    assert kv.trusted and set(kv.hbm) == {1, 2} and set(kv.host) == {7}
    ix.apply(batch(2, AllBlocksCleared(Medium.HBM)), now=0.0)
    assert set(ix.view("r0").hbm) == set() and set(ix.view("r0").host) == {7}
    ix.apply(batch(3, AllBlocksCleared()), now=0.0)
    assert set(ix.view("r0").host) == set()


def test_a_gap_distrusts_the_replica_until_the_replay_fills_it():
    ix = KvIndex()
    ix.apply(batch(0, BlockStored((1,))), 0.0)
    gap = ix.apply(batch(2, BlockStored((3,))), 0.0)
    assert gap == Gap("r0", 1, 2)
    kv = ix.view("r0")
    assert not kv.trusted and not kv.hbm and "replaying" in kv.why
    assert ix.apply(batch(3, BlockRemoved((1,))), 0.0) is None  # held, no second gap asked for
    ix.apply(batch(1, BlockStored((2,))), 0.0)  # the replay
    kv = ix.view("r0")
    assert kv.trusted and set(kv.hbm) == {2, 3}
    assert ix.stats().gaps == 1 and ix.stats().batches == 4


def test_a_replay_that_cannot_fill_the_gap_clears_the_view():
    ix = KvIndex()
    ix.apply(batch(0, BlockStored((1, 2))), 0.0)
    ix.apply(batch(5, BlockStored((9,))), 0.0)
    ix.replay_failed("r0", 0.0)
    kv = ix.view("r0")
    assert kv.trusted and set(kv.hbm) == {9}  # 1 and 2 may be gone: not claimed
    assert ix.stats().resets == 1
    ix.apply(batch(6, BlockStored((10,))), 0.0)
    assert set(ix.view("r0").hbm) == {9, 10}


def test_a_late_joiner_asks_for_the_replay_from_the_start():
    assert KvIndex().apply(batch(4, BlockStored((1,))), 0.0) == Gap("r0", 0, 4)


def test_duplicates_and_old_batches_are_ignored():
    ix = KvIndex()
    ix.apply(batch(0, BlockStored((1,))), 0.0)
    ix.apply(batch(1, BlockRemoved((1,))), 0.0)
    ix.apply(batch(0, BlockStored((1,))), 0.0)  # a stale duplicate must not resurrect block 1
    assert set(ix.view("r0").hbm) == set() and ix.stats().stale_batches == 1


def test_events_behind_the_lag_bound_are_not_trusted_and_say_so():
    ix = KvIndex(IndexLimits(max_lag_s=2.0))
    ix.apply(batch(0, BlockStored((1,)), ts=10.0), now=13.0)
    kv = ix.view("r0")
    assert not kv.trusted and "3.0 s behind" in kv.why
    assert ix.stats().distrusted == ("r0",)
    ix.apply(batch(1, BlockStored((2,)), ts=13.5), now=14.0)
    assert ix.view("r0").trusted and set(ix.view("r0").hbm) == {1, 2}


def test_a_forgotten_replica_offers_nothing():
    ix = KvIndex()
    ix.apply(batch(0, BlockStored((1,))), 0.0)
    ix.forget("r0")
    assert not ix.view("r0").trusted and not ix.view("r0").hbm
    assert ix.stats().replicas == 0


def test_memory_stays_bounded_when_removals_never_come():
    ix = KvIndex(IndexLimits(max_hashes=1000))
    for seq in range(200):  # 20,000 stores, no removal: as if every BlockRemoved were lost
        ix.apply(batch(seq, BlockStored(tuple(range(seq * 100, seq * 100 + 100)))), 0.0)
    st = ix.stats()
    assert st.hbm_hashes == 1000 and st.overflowed == 19_000
    assert set(ix.view("r0").hbm) == set(range(19_000, 20_000))  # the newest kept


def test_held_batches_are_bounded_too():
    ix = KvIndex(IndexLimits(max_held_batches=3))
    ix.apply(batch(0, BlockStored((1,))), 0.0)
    for seq in range(2, 6):  # batch 1 never comes
        ix.apply(batch(seq, BlockStored((seq,))), 0.0)
    kv = ix.view("r0")
    assert kv.trusted and set(kv.hbm) == {2, 3, 4, 5} and ix.stats().resets == 1


@pytest.mark.parametrize("seed", range(6))
def test_with_lost_reordered_and_repeated_batches_the_view_never_claims_a_block_the_engine_lacked(seed):
    """A real prefix cache publishes; the stream drops, swaps and repeats batches; replay serves
    only sometimes (its buffer is short). Whenever the index trusts a view, every hash in it was in the engine's
    cache as of the last batch applied."""
    rng = random.Random(seed)
    cache = PrefixCache(1, publish=True)  # capacity comes from the evictions below
    truth_after: list[set[int]] = []
    published: list[KvEventBatch] = []
    for seq in range(300):
        hashes = tuple(rng.randrange(40) * 1000 + i for i in range(rng.randrange(1, 8)))
        cache.acquire(hashes)
        cache.release(hashes)
        cache.evict(rng.randrange(0, 6))
        published.append(KvEventBatch("r0", seq, 0.0, tuple(cache.events)))
        cache.events.clear()
        truth_after.append(set(cache.cached))
    stream = [b for b in published if rng.random() > 0.1]
    for i in range(0, len(stream) - 1, 7):
        stream[i], stream[i + 1] = stream[i + 1], stream[i]
    stream += rng.sample(stream, 20)
    ix = KvIndex()
    for b in stream:
        gap = ix.apply(b, 0.0)
        if gap is not None:
            if rng.random() < 0.5:
                for s in range(gap.first_missing, gap.next_held):
                    ix.apply(published[s], 0.0)
            else:
                ix.replay_failed("r0", 0.0)
        kv = ix.view("r0")
        if kv.trusted:
            applied = ix._replicas["r0"].next_seq - 1
            assert set(kv.hbm) <= truth_after[applied]
