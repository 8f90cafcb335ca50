"""What a model is made of: its files, each with a size and a digest, and the cache key they make.

A cache entry is named by the sha256 of its manifest (`Manifest.key`), so two sources that
serve the same bytes share one entry, and a source that changes a file gets a new entry rather
than a silently different old one. Every file is checked against its digest as it is written.

The manifest file (`hbmserve-manifest.json`, written by `hbmserve cache manifest DIR`) is what an
HTTP or S3 source publishes beside the weights. Digests are sha256; `git-sha1` exists because
the Hugging Face Hub publishes only the git blob id of its small (non-LFS) files.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from hbmserve.weights.errors import ManifestError

MANIFEST_NAME = "hbmserve-manifest.json"
FORMAT = "hbmserve-manifest/1"
ALGORITHMS = ("sha256", "git-sha1")
_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative, "/"-separated, checked by `_safe_path`
    size: int
    digest: str  # "<algorithm>:<hex>", algorithm one of ALGORITHMS

    @property
    def algorithm(self) -> str:
        return self.digest.split(":", 1)[0]


@dataclass(frozen=True)
class Manifest:
    files: tuple[FileEntry, ...]  # sorted by path

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def key(self) -> str:
        """The content address: sha256 over the canonical file list, shortened (128 bits)."""
        canon = json.dumps([[f.path, f.size, f.digest] for f in self.files], separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:32]

    def to_json(self) -> str:
        files = [{"path": f.path, "size": f.size, f.algorithm: f.digest.split(":", 1)[1]} for f in self.files]
        return json.dumps({"format": FORMAT, "files": files}, indent=1) + "\n"


class Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...
    def hexdigest(self) -> str: ...


def new_hasher(entry: FileEntry) -> Hasher:
    """A running digest of `entry`'s algorithm; git-sha1 hashes git's blob header first."""
    if entry.algorithm == "git-sha1":
        h = hashlib.sha1()
        h.update(b"blob %d\0" % entry.size)
        return h
    return hashlib.sha256()


def hash_file(path: Path, entry: FileEntry) -> str:
    """`entry.digest`'s algorithm over the file at `path`, as "<algorithm>:<hex>"."""
    h = new_hasher(entry)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return f"{entry.algorithm}:{h.hexdigest()}"


def _safe_path(raw: object, where: str) -> str:
    # A manifest may come from a remote server: a path must never reach outside the entry.
    if not isinstance(raw, str) or not raw:
        raise ManifestError(f"{where}.path: must be a non-empty string")
    p = PurePosixPath(raw)
    if p.is_absolute() or ".." in p.parts or "\\" in raw or str(p) != raw:
        raise ManifestError(f"{where}.path: {raw!r} must be a plain relative path (no '..', no leading '/')")
    return raw


def make_manifest(files: list[FileEntry]) -> Manifest:
    seen = [f.path for f in files]
    dupes = sorted({p for p in seen if seen.count(p) > 1})
    if dupes:
        raise ManifestError(f"files listed twice: {', '.join(dupes)}")
    if not files:
        raise ManifestError("a manifest needs at least one file")
    return Manifest(tuple(sorted(files, key=lambda f: f.path)))


def parse_manifest(text: str | bytes, source: str) -> Manifest:
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ManifestError(f"manifest from {source} is not JSON: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("files"), list):
        raise ManifestError(f"manifest from {source}: expected {{'format': '{FORMAT}', 'files': [...]}}")
    files = []
    for i, raw in enumerate(data["files"]):
        where = f"files.{i}"
        if not isinstance(raw, dict):
            raise ManifestError(f"manifest from {source}: {where} must be a mapping")
        size, algos = raw.get("size"), [a for a in ALGORITHMS if a in raw]
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError(f"manifest from {source}: {where}.size must be a whole number >= 0")
        if len(algos) != 1 or not isinstance(raw[algos[0]], str):
            raise ManifestError(f"manifest from {source}: {where} needs exactly one digest of {', '.join(ALGORITHMS)}")
        hexd = raw[algos[0]].lower()
        if len(hexd) != (64 if algos[0] == "sha256" else 40) or any(c not in "0123456789abcdef" for c in hexd):
            raise ManifestError(f"manifest from {source}: {where}.{algos[0]} is not a hex digest")
        files.append(FileEntry(_safe_path(raw.get("path"), where), size, f"{algos[0]}:{hexd}"))
    try:
        return make_manifest(files)
    except ManifestError as e:
        raise ManifestError(f"manifest from {source}: {e}") from None


def manifest_of_dir(root: Path) -> Manifest:
    """Hash every regular file under `root` (the manifest file itself and dotfiles excepted)."""
    files = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel != MANIFEST_NAME and not any(part.startswith(".") for part in rel.split("/")):
            probe = FileEntry(rel, p.stat().st_size, "sha256:")
            files.append(FileEntry(rel, probe.size, hash_file(p, probe)))
    return make_manifest(files)
