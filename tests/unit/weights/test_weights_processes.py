"""Several real processes on one cache root: N starting at once download once, and a process
killed mid-fill leaves nothing visible; the next one clears its leftovers and fills."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest

from hbmserve.weights.cache import WeightCache
from hbmserve.weights.http_source import HttpSource
from hbmserve.weights.sources import SourceOptions

FAST = SourceOptions(attempts=2, backoff_initial_s=0.01, backoff_max_s=0.02, timeout_s=10)
SHARD = "model.safetensors"
# fork: children inherit the test's imports; each runs one acquire and exits through os._exit.
CTX = mp.get_context("fork")


def _replica(root: str, url: str, barrier, results) -> None:
    src = HttpSource(url, FAST)
    barrier.wait(timeout=10)
    got = WeightCache(Path(root), 10_000_000).acquire(src, src.manifest())
    results.put((os.getpid(), got.hit, str(got.path), (got.path / SHARD).stat().st_size))
    got.release()


@pytest.mark.timeout(60)
def test_n_processes_starting_together_download_once(tmp_path, serve_files, kit) -> None:
    n, files = 4, kit.model_files()
    # Each model-file GET waits 0.3 s first, so the racers overlap the one fill.
    server = serve_files(kit.with_manifest(files), delay_s=0.3)
    barrier, results = CTX.Barrier(n), CTX.Queue()
    procs = [CTX.Process(target=_replica, args=(str(tmp_path / "c"), server.url, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    got = [results.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=10)
        assert p.exitcode == 0
    assert server.gets(SHARD) == 1  # one download on the node
    assert sorted(hit for _, hit, _, _ in got) == [False] + [True] * (n - 1)
    assert {(path, size) for _, _, path, size in got} == {(got[0][2], len(files[SHARD]))}


def _filler(root: str, url: str) -> None:
    src = HttpSource(url, FAST)
    WeightCache(Path(root), 10_000_000).acquire(src, src.manifest())


@pytest.mark.timeout(60)
def test_a_fill_killed_midway_leaves_nothing_and_is_cleaned_up(tmp_path, serve_files, kit) -> None:
    files = kit.model_files()
    server = serve_files(kit.with_manifest(files), faults={SHARD: ["stall"]})
    cache = WeightCache(tmp_path / "c", 10_000_000)
    child = CTX.Process(target=_filler, args=(str(cache.root), server.url))
    child.start()
    deadline = time.monotonic() + 20
    partial = []
    while not partial and time.monotonic() < deadline:  # until half the shard is on disk
        partial = [p for p in cache.tmp.glob(f"*/model/{SHARD}") if p.stat().st_size > 0] if cache.tmp.exists() else []
        time.sleep(0.02)
    assert partial, "the child never started writing"
    os.kill(child.pid, signal.SIGKILL)
    child.join(timeout=10)
    assert child.exitcode == -signal.SIGKILL
    assert cache.ls() == []  # nothing half-written is visible
    assert any(cache.tmp.iterdir())  # its leftovers stay until the next fill
    # Its flocks died with it: the next process cleans up and fills without waiting.
    got = cache.acquire(HttpSource(server.url, FAST), HttpSource(server.url, FAST).manifest())
    got.release()
    assert not got.hit and (got.path / SHARD).read_bytes() == files[SHARD]
    assert list(cache.tmp.iterdir()) == []
