"""Where weights come from, behind one interface: a manifest, then each file into a sink.

    /models/llama or ~/m or file:///models/llama    a local (or mounted) directory
    http://host/models/llama/ (or https)            files under a base URL, beside hbmserve-manifest.json
    org/name, org/name@rev, hf://org/name@rev       the Hugging Face Hub (huggingface_hub)
    s3://bucket/prefix                              S3-compatible storage, when boto3 is installed

`parse_source` picks the kind from the string through `SOURCE_KINDS` (a registry, so a new kind
is one entry). Constructing a source does no I/O; `manifest()` is the first call that may touch
the network and it fails fast, with the cause named, when the source cannot be reached.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from hbmserve.weights.errors import SourceError
from hbmserve.weights.fs import Sink
from hbmserve.weights.manifest import MANIFEST_NAME, FileEntry, Manifest, manifest_of_dir, parse_manifest

# Called with the bytes each write added (negative when a file starts again).
Progress = Callable[[int], None]


def no_progress(_n: int) -> None:
    return None


class Transient(Exception):
    """One try failed in a way the next might not; carries the error to raise when tries run out."""

    def __init__(self, final: Exception) -> None:
        super().__init__(str(final))
        self.final = final


@dataclass(frozen=True)
class SourceOptions:
    """How hard a network source tries before it gives up (each try resumes where the last ended)."""

    attempts: int = 5
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 20.0
    timeout_s: float = 30.0  # connect and per-read; a dead network fails after this, never hangs


def with_retries(opts: SourceOptions, attempt: Callable[[], None]) -> None:
    """Run `attempt` until it stops raising Transient, at most `opts.attempts` times, with
    jittered exponential back-off between tries (tenacity); then raise the last error it carried."""
    retrying = Retrying(stop=stop_after_attempt(opts.attempts), retry=retry_if_exception_type(Transient),
                        wait=wait_exponential_jitter(initial=opts.backoff_initial_s, max=opts.backoff_max_s),
                        reraise=True)
    try:
        retrying(attempt)
    except Transient as e:
        raise e.final from e.__cause__


class Source(Protocol):
    @property
    def uri(self) -> str:
        """The source as the config names it (shown by `hbmserve cache ls`)."""
        ...

    def manifest(self) -> Manifest:
        """The model's files with sizes and digests. Raises SourceUnavailable when unreachable."""
        ...

    def fetch(self, entry: FileEntry, sink: Sink, progress: Progress) -> None:
        """Write `entry`'s bytes from `sink.size` on; the caller checks size and digest."""
        ...


@dataclass(frozen=True)
class LocalDirSource:
    """A directory on this node (a mounted share, in practice). Without a manifest file in it,
    the manifest is computed by hashing every file, which reads the model once more."""

    path: Path

    @property
    def uri(self) -> str:
        return str(self.path)

    def fingerprint(self) -> str | None:
        """Each file's path, size and modification time, hashed: what must change for the bytes
        to change, in practice, at the cost of a stat per file. None with a published manifest
        (it is read, not computed) or no directory."""
        if not self.path.is_dir() or (self.path / MANIFEST_NAME).is_file():
            return None
        stats = sorted((p.relative_to(self.path).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
                       for p in self.path.rglob("*") if p.is_file())
        return hashlib.sha256(json.dumps(stats).encode()).hexdigest()

    def manifest(self) -> Manifest:
        if not self.path.is_dir():
            raise SourceError(f"no model directory at {self.path}")
        published = self.path / MANIFEST_NAME
        if published.is_file():
            return parse_manifest(published.read_bytes(), str(published))
        return manifest_of_dir(self.path)

    def fetch(self, entry: FileEntry, sink: Sink, progress: Progress) -> None:
        src = self.path / entry.path
        try:
            f = open(src, "rb", buffering=0)
        except FileNotFoundError:
            raise SourceError(f"{src}: listed in the manifest but missing") from None
        with f:
            f.seek(sink.size)
            buf = bytearray(8 * 1024 * 1024)
            while n := f.readinto(buf):
                sink.write(memoryview(buf)[:n])
                progress(n)


def _local(uri: str, _opts: SourceOptions) -> Source:
    path = uri.removeprefix("file://")
    return LocalDirSource(Path(os.path.expanduser(path)).resolve())


def _http(uri: str, opts: SourceOptions) -> Source:
    from hbmserve.weights.http_source import HttpSource

    return HttpSource(uri, opts)


def _hub(uri: str, opts: SourceOptions) -> Source:
    from hbmserve.weights.hub_source import HubSource, parse_hub_id

    repo, revision = parse_hub_id(uri.removeprefix("hf://"))
    return HubSource(repo, revision, opts)


def _s3(uri: str, opts: SourceOptions) -> Source:
    from hbmserve.weights.s3_source import s3_source

    return s3_source(uri, opts)


SOURCE_KINDS: dict[str, Callable[[str, SourceOptions], Source]] = {
    "file": _local, "http": _http, "https": _http, "hf": _hub, "s3": _s3,
}


def parse_source(uri: str, opts: SourceOptions = SourceOptions()) -> Source:
    if uri.startswith(("/", "~", ".")):
        return _local(uri, opts)
    scheme, sep, _rest = uri.partition("://")
    if not sep:
        return _hub(uri, opts)  # "org/name": what vLLM and transformers accept as a model
    kind = SOURCE_KINDS.get(scheme)
    if kind is None:
        raise SourceError(f"unknown source scheme {scheme!r} in {uri!r}; known: {', '.join(SOURCE_KINDS)}")
    return kind(uri, opts)
