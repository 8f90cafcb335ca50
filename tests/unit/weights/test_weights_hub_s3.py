"""The Hub source fails fast and says why without a network (this machine has none), maps the
Hub's metadata to a manifest, and checks git blob ids; S3 needs boto3 and says so."""

from __future__ import annotations

import hashlib
import sys
import time
from io import BytesIO
from types import SimpleNamespace

import pytest

from hbmserve.weights.cache import WeightCache
from hbmserve.weights.errors import ChecksumMismatch, SourceError, SourceUnavailable
from hbmserve.weights.hub_source import HubSource, manifest_from_siblings, parse_hub_id
from hbmserve.weights.s3_source import S3Source
from hbmserve.weights.sources import SourceOptions, parse_source

FAST = SourceOptions(attempts=2, backoff_initial_s=0.01, backoff_max_s=0.02, timeout_s=3)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_hub_ids_parse() -> None:
    assert parse_hub_id("meta-llama/Llama-3.1-8B") == ("meta-llama/Llama-3.1-8B", None)
    assert parse_hub_id("org/m@abc123") == ("org/m", "abc123")
    for bad in ("justname", "a/b/c", "org/m@", "/m"):
        with pytest.raises(SourceError, match="not a Hub model id"):
            parse_hub_id(bad)
    assert parse_source("hf://org/m@v1") == HubSource("org/m", "v1")
    assert parse_source("org/m") == HubSource("org/m")


def test_offline_mode_fails_at_once_with_the_reason(monkeypatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    t0 = time.monotonic()
    with pytest.raises(SourceUnavailable, match="HF_HUB_OFFLINE is set"):
        HubSource("org/m", opts=SourceOptions(attempts=5, backoff_initial_s=1.0)).manifest()
    assert time.monotonic() - t0 < 1.0  # not retried: 5 tries would take 1 + 2 + 4 + 8 s


def test_no_route_to_the_hub_fails_fast_and_names_it() -> None:
    t0 = time.monotonic()
    with pytest.raises(SourceUnavailable, match=r"cannot reach the Hugging Face Hub at http://127.0.0.1:9 after 2"):
        HubSource("org/m", opts=FAST, endpoint="http://127.0.0.1:9").manifest()
    assert time.monotonic() - t0 < 10


def test_a_hub_that_answers_404_is_not_called_unreachable(serve_files) -> None:
    server = serve_files({})  # answers 404 to everything, as the Hub does for an unknown repo
    with pytest.raises(SourceError) as e:
        HubSource("org/missing", opts=FAST, endpoint=server.url.removesuffix("/m")).manifest()
    assert not isinstance(e.value, SourceUnavailable) and "org/missing" in str(e.value)


def test_siblings_become_a_manifest() -> None:
    lfs = SimpleNamespace(rfilename="model.safetensors", size=10, lfs=SimpleNamespace(sha256="ab" * 32), blob_id="x")
    small = SimpleNamespace(rfilename="config.json", size=2, lfs=None, blob_id="cd" * 20)
    m = manifest_from_siblings([lfs, small], "org/m")
    assert [(f.path, f.digest) for f in m.files] == [("config.json", "git-sha1:" + "cd" * 20),
                                                      ("model.safetensors", "sha256:" + "ab" * 32)]


def test_hub_fetch_adopts_the_download_and_checks_its_git_blob_id(tmp_path, monkeypatch) -> None:
    """hf_hub_download is stubbed (no network here): it writes the file as the real one does,
    into local_dir; the cache must verify it against the Hub's blob id and publish it."""
    import huggingface_hub

    data = b'{"hidden_size": 64}'
    calls = []

    def fake_download(repo, filename, *, revision, local_dir, endpoint, etag_timeout):
        calls.append((repo, filename, revision, etag_timeout))
        (local_dir / filename).parent.mkdir(parents=True, exist_ok=True)
        (local_dir / filename).write_bytes(served)
        return str(local_dir / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    sib = SimpleNamespace(rfilename="config.json", size=len(data), lfs=None, blob_id=git_blob_id(data))
    manifest = manifest_from_siblings([sib], "org/m")
    src = HubSource("org/m", "main", FAST)
    src.commit = "c0ffee"  # as manifest() would have set it
    cache = WeightCache(tmp_path / "c", 10**6)
    served = data
    got = cache.acquire(src, manifest)
    got.release()
    assert (got.path / "config.json").read_bytes() == data
    assert calls == [("org/m", "config.json", "c0ffee", 3)]  # the pinned commit, the bounded timeout
    assert sorted(p.name for p in got.path.iterdir()) == ["config.json"]  # no staging left behind
    served = data.replace(b"64", b"65")
    with pytest.raises(ChecksumMismatch, match="git-sha1"):
        WeightCache(tmp_path / "c2", 10**6).acquire(src, manifest)


def test_s3_without_boto3_says_to_install_it(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # makes `import boto3` raise ImportError
    with pytest.raises(SourceError, match=r"need boto3.*pip install boto3"):
        parse_source("s3://bucket/models/llama")


class FakeS3:
    """get_object as boto3 has it; the first read of each object is cut short once."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects, self.ranges, self.cut = objects, [], set()

    def get_object(self, Bucket: str, Key: str, Range: str | None = None):  # noqa: N803 (boto3's names)
        self.ranges.append((Key, Range))
        if Key not in self.objects:
            raise type("ClientError", (Exception,), {})("NoSuchKey")  # no .response: like a network error
        start = int(Range.removeprefix("bytes=").rstrip("-")) if Range else 0
        data = self.objects[Key][start:]
        if Key not in self.cut and not Key.endswith(".json"):
            self.cut.add(Key)
            return {"Body": _CutStream(data[: len(data) // 2])}
        return {"Body": BytesIO(data)}


class _CutStream(BytesIO):
    def read(self, n: int = -1) -> bytes:
        chunk = super().read(n)
        if not chunk:
            raise OSError("connection reset")
        return chunk


def test_s3_resumes_a_cut_stream_with_a_range(tmp_path, kit) -> None:
    files = kit.model_files()
    s3 = FakeS3({f"pre/{k}": v for k, v in kit.with_manifest(files).items()})
    src = S3Source("bucket", "pre", s3, FAST)
    got = WeightCache(tmp_path / "c", 10**7).acquire(src, src.manifest())
    got.release()
    assert all((got.path / k).read_bytes() == v for k, v in files.items())
    half = len(files["model.safetensors"]) // 2
    assert ("pre/model.safetensors", f"bytes={half}-") in s3.ranges
