"""The HTTP source against a real server on 127.0.0.1 with injected faults (conftest.FaultServer):
resumable Range requests, retries with back-off, and an error that names the cause when the
tries run out. After every failure the cache shows no entry and no temp files."""

from __future__ import annotations

import pytest

from hbmserve.weights.cache import WeightCache
from hbmserve.weights.errors import ChecksumMismatch, SourceError, SourceUnavailable, TruncatedDownload
from hbmserve.weights.http_source import HttpSource
from hbmserve.weights.manifest import MANIFEST_NAME
from hbmserve.weights.sources import SourceOptions, parse_source

FAST = SourceOptions(attempts=3, backoff_initial_s=0.01, backoff_max_s=0.02, timeout_s=5)
SHARD = "model.safetensors"


@pytest.fixture
def setup(tmp_path, serve_files, kit):
    def start(faults: dict[str, list[str]] | None = None, **kw):
        files = kit.model_files()
        server = serve_files(kit.with_manifest(files), faults=faults or {}, **kw)
        return server, HttpSource(server.url, FAST), WeightCache(tmp_path / "c", 10_000_000), files
    return start


def fill(cache, src):
    got = cache.acquire(src, src.manifest())
    got.release()
    return got


def assert_nothing_visible(cache: WeightCache) -> None:
    assert cache.ls() == [] and list(cache.tmp.iterdir()) == []


def test_clean_download_and_parse_source(setup) -> None:
    server, src, cache, files = setup()
    assert parse_source(server.url, FAST) == src
    got = fill(cache, src)
    assert (got.path / SHARD).read_bytes() == files[SHARD]
    assert server.gets(SHARD) == 1 and server.requests[-1][1] is None  # no Range on a fresh file


def test_a_cut_connection_resumes_with_a_range_request(setup) -> None:
    server, src, cache, files = setup({SHARD: ["truncate"]})
    got = fill(cache, src)
    assert (got.path / SHARD).read_bytes() == files[SHARD]
    ranges = [r for p, r in server.requests if p == SHARD]
    assert ranges == [None, f"bytes={len(files[SHARD]) // 2}-"]  # the second try asked for the rest only


def test_a_server_that_ignores_range_restarts_the_file(setup) -> None:
    server, src, cache, files = setup({SHARD: ["truncate", "ignore-range"]})
    assert (fill(cache, src).path / SHARD).read_bytes() == files[SHARD]
    assert server.gets(SHARD) == 2


def test_5xx_is_retried(setup) -> None:
    server, src, cache, files = setup({SHARD: ["500", "500"], MANIFEST_NAME: ["500"]})
    assert (fill(cache, src).path / SHARD).read_bytes() == files[SHARD]
    assert server.gets(SHARD) == 3 and server.gets(MANIFEST_NAME) == 2


def test_persistent_5xx_names_status_and_url(setup) -> None:
    server, src, cache, _ = setup({SHARD: ["500"] * 3})
    with pytest.raises(SourceError, match=rf"{SHARD}: HTTP 500 after 3 tries"):
        fill(cache, src)
    assert server.gets(SHARD) == 3
    assert_nothing_visible(cache)


def test_404_is_final_at_once(setup) -> None:
    server, src, cache, _ = setup({SHARD: ["404"]})
    with pytest.raises(SourceError, match=rf"{SHARD}: HTTP 404") as e:
        fill(cache, src)
    assert not isinstance(e.value, SourceUnavailable) and server.gets(SHARD) == 1
    assert_nothing_visible(cache)


def test_a_missing_manifest_says_how_to_publish_one(setup) -> None:
    _, src, _, _ = setup({MANIFEST_NAME: ["404"]})
    with pytest.raises(SourceError, match="hbmserve cache manifest DIR"):
        src.manifest()


def test_truncated_every_time_names_the_bytes_received(setup) -> None:
    server, src, cache, files = setup({SHARD: ["short"] * 3})
    # "short" answers a shorter Content-Length: each try gets half of what it asks for.
    size = len(files[SHARD])
    with pytest.raises(TruncatedDownload, match=rf"sent \d+ of {size} bytes after 3 tries"):
        fill(cache, src)
    assert_nothing_visible(cache)


def test_wrong_bytes_are_a_checksum_mismatch(setup) -> None:
    _, src, cache, _ = setup({SHARD: ["corrupt"]})
    with pytest.raises(ChecksumMismatch, match=rf"{SHARD}: sha256:\w+ does not match"):
        fill(cache, src)
    assert_nothing_visible(cache)


def test_an_unreachable_server_fails_fast(tmp_path) -> None:
    src = HttpSource("http://127.0.0.1:9/m", FAST)  # port 9 (discard): nothing listens
    with pytest.raises(SourceUnavailable, match="cannot reach http://127.0.0.1:9/m/hbmserve-manifest.json after 3"):
        src.manifest()
