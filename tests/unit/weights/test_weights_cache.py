"""The cache on a real directory with a local source: hit and miss, atomic publish, LRU eviction
that spares leased and pinned entries, a full disk, a cap too small, a racing writer."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil

import pytest

from hbmserve.weights import fs
from hbmserve.weights.cache import WeightCache
from hbmserve.weights.errors import CacheFull, ChecksumMismatch, DiskFull, EntryBusy, SourceError
from hbmserve.weights.manifest import MANIFEST_NAME
from hbmserve.weights.sources import LocalDirSource

MB = 1_000_000


@pytest.fixture
def source(tmp_path, kit):
    def make(seed: int = 0, big: int = 300_000) -> LocalDirSource:
        return LocalDirSource(kit.write_dir(tmp_path / f"src{seed}", kit.model_files(seed, big)))
    return make


def fill(cache: WeightCache, src: LocalDirSource):
    got = cache.acquire(src, src.manifest())
    got.release()
    return got


def test_miss_then_hit_with_verified_read_only_files(tmp_path, source, kit) -> None:
    cache, src = WeightCache(tmp_path / "c", 100 * MB), source()
    first = fill(cache, src)
    assert not first.hit and first.bytes_fetched == src.manifest().total_bytes
    second = fill(cache, src)
    assert second.hit and second.bytes_fetched == 0 and second.path == first.path
    for rel, data in kit.model_files().items():
        p = first.path / rel
        assert p.read_bytes() == data and not os.stat(p).st_mode & 0o222
    assert list((tmp_path / "c" / "tmp").iterdir()) == []
    [info] = cache.ls()
    assert (info.key, info.source, info.files, info.size_bytes) == (first.key, src.uri, 3, first.bytes_fetched)


def test_checksum_mismatch_publishes_nothing(tmp_path, source, kit) -> None:
    src = source()
    files = kit.model_files()
    lying = json.loads(kit.manifest_json(files))
    lying["files"][1]["sha256"] = hashlib.sha256(b"other bytes").hexdigest()  # model.safetensors (sorted)
    (src.path / MANIFEST_NAME).write_text(json.dumps(lying))
    cache = WeightCache(tmp_path / "c", 100 * MB)
    with pytest.raises(ChecksumMismatch, match=r"model\.safetensors: sha256:\w+ does not match") as e:
        fill(cache, src)
    assert str(src.path) in str(e.value) and "nothing was published" in str(e.value)
    assert cache.ls() == [] and list(cache.tmp.iterdir()) == []


def test_missing_source_and_missing_file_are_named(tmp_path, source) -> None:
    with pytest.raises(SourceError, match="no model directory at"):
        LocalDirSource(tmp_path / "nope").manifest()
    src = source()
    manifest = src.manifest()
    (src.path / "config.json").unlink()
    with pytest.raises(SourceError, match="config.json: listed in the manifest but missing"):
        WeightCache(tmp_path / "c", 100 * MB).acquire(src, manifest)


def test_disk_full_mid_write_leaves_nothing(tmp_path, source, monkeypatch) -> None:
    """ENOSPC simulated by swapping the sink's one write call (weights/fs.py `_os_write`) for one
    that writes at most 64 KiB a call (as os.write may) and raises OSError(ENOSPC) once 100 kB
    are written: the error a full disk gives."""
    written = [0]

    def write(fd: int, data) -> int:
        if written[0] >= 100_000:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = os.write(fd, data[:65536])
        written[0] += n
        return n

    monkeypatch.setattr(fs, "_os_write", write)
    cache = WeightCache(tmp_path / "c", 100 * MB)
    with pytest.raises(DiskFull, match=r"disk full \(ENOSPC\) writing model\.safetensors at byte 131072 "):
        fill(cache, source())
    assert cache.ls() == [] and list(cache.tmp.iterdir()) == []


def test_too_little_free_disk_is_refused_before_any_byte(tmp_path, source) -> None:
    cache = WeightCache(tmp_path / "c", 100 * MB, min_free_bytes=shutil.disk_usage(tmp_path).free + 1)
    with pytest.raises(DiskFull, match="disk's free space"):
        fill(cache, source())
    assert cache.ls() == []


def test_a_model_over_the_cap_is_refused(tmp_path, source) -> None:
    with pytest.raises(CacheFull, match="cap"):
        fill(WeightCache(tmp_path / "c", 100_000), source(big=200_000))


def test_lru_eviction_spares_leased_and_pinned(tmp_path, source) -> None:
    # Each model is ~300 kB; a cap of 1 MB holds three.
    cache = WeightCache(tmp_path / "c", MB)
    a, b, c, d, e = (source(i) for i in range(5))
    key = {s: fill(cache, s).key for s in (a, b, c)}
    fill(cache, a)  # a becomes the most recently used; b is now the oldest
    key[d] = fill(cache, d).key
    assert {i.key for i in cache.ls()} == {key[a], key[c], key[d]}  # b evicted
    # c is oldest now, but a replica holds it; a is pinned: the fill of e must evict d.
    held = cache.acquire(c, c.manifest())
    cache.pin(key[a])
    fill(cache, e)
    assert {i.key for i in cache.ls()} == {key[a], key[c], e.manifest().key}
    in_use = {i.key: (i.in_use, i.pinned) for i in cache.ls()}
    assert in_use[key[c]] == (True, False) and in_use[key[a]] == (False, True)
    # Everything left is held: a sixth model cannot fit and nothing is evicted in vain.
    with pytest.raises(CacheFull, match="in use or pinned"):
        fill(cache, source(5, big=600_000))
    assert len(cache.ls()) == 3
    held.release()
    assert not {i.key: i for i in cache.ls()}[key[c]].in_use


def test_a_fill_in_progress_holds_its_space(tmp_path, source) -> None:
    """Two fills at once on a cache with room for one: the second is refused while the first
    runs (its bytes are reserved, not yet on disk), and nothing is evicted for it."""
    import threading

    cache, a, b = WeightCache(tmp_path / "c", 450_000), source(0), source(1)
    started, go = threading.Event(), threading.Event()

    class Slow:
        uri = a.uri

        def manifest(self):
            return a.manifest()

        def fetch(self, entry, sink, progress):
            started.set()
            go.wait(10)
            a.fetch(entry, sink, progress)

    done = []
    t = threading.Thread(target=lambda: done.append(fill(cache, Slow())))
    t.start()
    assert started.wait(10)
    with pytest.raises(CacheFull, match="being filled"):
        fill(cache, b)
    go.set()
    t.join(10)
    assert [i.key for i in cache.ls()] == [done[0].key]


def test_evict_refuses_in_use_and_pinned(tmp_path, source) -> None:
    cache, src = WeightCache(tmp_path / "c", MB), source()
    held = cache.acquire(src, src.manifest())
    with pytest.raises(EntryBusy, match="in use"):
        cache.evict(held.key)
    held.release()
    cache.pin(held.key)
    with pytest.raises(EntryBusy, match="pinned"):
        cache.evict(held.key)
    assert cache.evict(held.key, force=True).key == held.key
    assert cache.ls() == [] and not held.path.exists()


def test_a_racing_writer_that_published_first_wins_cleanly(tmp_path, source) -> None:
    """Another writer (a second host on a shared root, bypassing this node's lock) publishes the
    same content while this fill runs: the fill keeps theirs and leaves no temp files."""
    cache, src = WeightCache(tmp_path / "c", 100 * MB), source()
    manifest = src.manifest()
    other = WeightCache(tmp_path / "other", 100 * MB)
    theirs = fill(other, src)

    class Racing:
        uri = src.uri

        def manifest(self):
            return manifest

        def fetch(self, entry, sink, progress):
            src.fetch(entry, sink, progress)
            if entry == manifest.files[-1]:  # they finish first
                shutil.copytree(theirs.path.parent, cache.entries / manifest.key)

    got = cache.acquire(Racing(), manifest)
    got.release()
    assert got.path == cache.model_path(manifest.key) and not got.hit
    assert sorted(p.name for p in got.path.iterdir()) == ["config.json", "model.safetensors", "tok"]
    assert list(cache.tmp.iterdir()) == []
