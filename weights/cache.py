"""The node's weight cache: one directory tree, shared by every process on the node through locks.

    entries/<key>/model/...    published model files, read-only: the path an engine loads
    entries/<key>/entry.json   manifest and source; its mtime is the entry's last use (LRU)
    tmp/<key>.<pid>.<n>/       a fill in progress (model/ and entry.json), or debris of a dead one
    tmp/<key>.<pid>.<n>.owner  flocked by the fill's process until it has published; holds the
                               bytes it reserved against the cap
    locks/<key>.fill           exclusive while one process fills <key>; others wait, then hit
    locks/<key>.lease          shared by each process using <key>; eviction needs it exclusive
    locks/root                 exclusive for the short bookkeeping (clean, plan, evict, reserve)
    pins/<key>                 present while the warm pool keeps <key>
    index/<hash of uri>.json   the key a source resolved to last (resolve's offline fallback)

A fill writes into tmp/, checks every file's size and digest, fsyncs, then renames the whole
directory into entries/: an entry is either complete and verified, or absent. Every lock is an
flock, so a process killed at any point holds nothing afterwards, and its tmp/ leftovers are
removed by the next process that takes the root lock (a tmp dir whose .owner lock is free has
no filler). Lock order: lease (shared), then fill, then root; the root lock is only held for
non-blocking work, so no process waits in a cycle.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from hbmserve.weights.errors import CacheFull, DiskFull, EntryBusy, WeightCacheError
from hbmserve.weights.eviction import CacheSnapshot, EntryState, Limit, plan_eviction
from hbmserve.weights.fs import HeldLock, fsync_dir, is_locked, lock, open_sink, try_lock
from hbmserve.weights.manifest import Manifest, parse_manifest
from hbmserve.weights.sources import Progress, Source, no_progress

_ENTRY = "entry.json"


@dataclass(frozen=True)
class EntryInfo:
    key: str
    source: str  # the source that filled it
    size_bytes: int
    files: int
    last_used_s: float
    in_use: bool
    pinned: bool
    path: Path  # the model directory


@dataclass
class Acquired:
    """A model made local, and the lease that keeps it from eviction until `release()`."""

    key: str
    path: Path
    hit: bool
    bytes_fetched: int
    seconds: float
    lease: HeldLock

    def release(self) -> None:
        self.lease.release()


class WeightCache:
    def __init__(self, root: Path, max_bytes: int, min_free_bytes: int = 0) -> None:
        self.root, self.max_bytes, self.min_free_bytes = root, max_bytes, min_free_bytes
        self.entries, self.tmp, self.locks = root / "entries", root / "tmp", root / "locks"
        self.pins, self.index = root / "pins", root / "index"

    def _dirs(self) -> None:
        for d in (self.entries, self.tmp, self.locks, self.pins, self.index):
            d.mkdir(parents=True, exist_ok=True)

    def model_path(self, key: str) -> Path:
        return self.entries / key / "model"

    def _root_lock(self) -> HeldLock:
        self._dirs()
        return lock(self.locks / "root", exclusive=True)

    # -- making a model local -------------------------------------------------------------
    def acquire(self, source: Source, manifest: Manifest, progress: Progress = no_progress,
                fingerprint: str | None = None) -> Acquired:
        """The model as a local directory: a hit when published, else one fill per node (every
        other process asking meanwhile waits on the fill lock, then hits). The returned lease
        must be held as long as the files are used. `fingerprint`: the source's cheap identity
        (see `known_manifest`), remembered with the key."""
        key = manifest.key
        self._dirs()
        lease = lock(self.locks / f"{key}.lease", exclusive=False)
        try:
            if not (self.entries / key).is_dir():
                with lock(self.locks / f"{key}.fill", exclusive=True):
                    if not (self.entries / key).is_dir():  # nobody filled it while we waited
                        t0 = time.monotonic()
                        self._fill(key, source, manifest, progress)
                        self._remember(source.uri, key, fingerprint)
                        return Acquired(key, self.model_path(key), False, manifest.total_bytes,
                                        time.monotonic() - t0, lease)
            _touch(self.entries / key / _ENTRY)
            self._remember(source.uri, key, fingerprint)
            return Acquired(key, self.model_path(key), True, 0, 0.0, lease)
        except BaseException:
            lease.release()
            raise

    def _fill(self, key: str, source: Source, manifest: Manifest, progress: Progress) -> None:
        tmp, owner = self._reserve(key, manifest.total_bytes)
        try:
            for entry in manifest.files:
                sink = open_sink(tmp / "model" / entry.path, entry)
                try:
                    source.fetch(entry, sink, progress)
                    sink.finish()
                finally:
                    sink.close()
                os.chmod(sink.path, 0o444)
            (tmp / _ENTRY).write_text(json.dumps({"source": source.uri, "manifest": json.loads(manifest.to_json())}))
            _touch(tmp / _ENTRY)
            for d in sorted({p.parent for p in (tmp / "model").rglob("*")} | {tmp}, reverse=True):
                fsync_dir(d)
            self._publish(tmp, key)
        except WeightCacheError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            # the same class, so callers can still tell the causes apart; the message names the source
            raise type(e)(f"{source.uri} -> {self.root}: {e}; nothing was published (partial files removed)") from e
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            owner.path.unlink(missing_ok=True)  # before the release: a probe then finds no file, not a free lock
            owner.release()

    def _publish(self, tmp: Path, key: str) -> None:
        try:
            os.rename(tmp, self.entries / key)
        except OSError:
            # A racing writer that bypassed the fill lock (another host on a shared root, say)
            # published the same content first: same key, same verified bytes, so keep theirs.
            if not (self.entries / key).is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        fsync_dir(self.entries)

    def _reserve(self, key: str, need: int) -> tuple[Path, HeldLock]:
        """Under the root lock: clear dead fills, evict to make room, claim the space. The fill
        owns its tmp dir through the flock on tmp/<name>.owner, held until it has published."""
        with self._root_lock():
            self._clean_locked()
            held = self._probe_entries()
            try:
                plan = plan_eviction(self._snapshot(held), need)
                if not plan.fits:
                    raise (CacheFull if plan.blocked_by is Limit.CAP else DiskFull)(plan.reason)
                for k in plan.evict:
                    self._remove_locked(k)
            finally:
                _release(held)
            tmp = self.tmp / f"{key}.{os.getpid()}.{time.monotonic_ns()}"
            (tmp / "model").mkdir(parents=True)
            owner = lock(self.tmp / f"{tmp.name}.owner", exclusive=True)
            owner.path.write_text(json.dumps({"bytes": need}))  # the reservation lives as long as the lock
            return tmp, owner

    # -- bookkeeping (callers hold the root lock) -------------------------------------------
    def _probe_entries(self) -> dict[str, HeldLock | None]:
        """Every published key, with its lease taken exclusively when nobody uses it (None when
        in use). Holding them until the decision is carried out keeps a new user from leasing an
        entry between the snapshot and its eviction."""
        return {d.name: try_lock(self.locks / f"{d.name}.lease", exclusive=True)
                for d in sorted(self.entries.iterdir()) if d.is_dir()}

    def _snapshot(self, held: dict[str, HeldLock | None]) -> CacheSnapshot:
        states = []
        for key, held_lease in held.items():
            info = self._read_entry(key)
            states.append(EntryState(key, info.size_bytes if info else 0, _mtime(self.entries / key / _ENTRY),
                                     in_use=held_lease is None, pinned=(self.pins / key).exists()))
        # Dead fills' .owner files were cleared just before, under the same root lock.
        reserved = sum(json.loads(t.read_text() or "{}").get("bytes", 0) for t in self.tmp.glob("*.owner"))
        # Conservative: other fills' reservations are taken off the free space as if written.
        free = max(0, shutil.disk_usage(self.root).free - reserved)
        return CacheSnapshot(tuple(states), reserved, self.max_bytes, free, self.min_free_bytes)

    def _remove_locked(self, key: str) -> None:
        # Rename first: the entry disappears at once, and a crash mid-delete leaves only tmp/ debris.
        trash = self.tmp / f"evicted-{key}.{os.getpid()}.{time.monotonic_ns()}"
        os.rename(self.entries / key, trash)
        shutil.rmtree(trash, ignore_errors=True)
        (self.pins / key).unlink(missing_ok=True)

    def _clean_locked(self) -> None:
        """Remove what dead fills and interrupted evictions left in tmp/."""
        for t in sorted(self.tmp.iterdir()):
            owner = t if t.suffix == ".owner" else self.tmp / f"{t.name}.owner"
            if not is_locked(owner):  # its filler is gone (or it is an eviction's debris)
                shutil.rmtree(t, ignore_errors=True) if t.is_dir() else t.unlink(missing_ok=True)

    def _read_entry(self, key: str) -> EntryInfo | None:
        path = self.entries / key / _ENTRY
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        manifest = parse_manifest(json.dumps(data["manifest"]), str(path))
        return EntryInfo(key, data["source"], manifest.total_bytes, len(manifest.files), _mtime(path),
                         is_locked(self.locks / f"{key}.lease"), (self.pins / key).exists(), self.model_path(key))

    def _remember(self, uri: str, key: str, fingerprint: str | None = None) -> None:
        name = hashlib.sha256(uri.encode()).hexdigest()[:32] + ".json"
        tmp = self.index / f".{name}.{os.getpid()}"
        tmp.write_text(json.dumps({"uri": uri, "key": key, "fingerprint": fingerprint}))
        os.replace(tmp, self.index / name)

    def known_manifest(self, uri: str, fingerprint: str) -> Manifest | None:
        """The manifest `uri` resolved to last, if the source still has the same `fingerprint`
        and the entry is still here: a local source is then not hashed again on every start."""
        path = self.index / (hashlib.sha256(uri.encode()).hexdigest()[:32] + ".json")
        try:
            known = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        key = known.get("key")
        if known.get("fingerprint") != fingerprint or not key or not (self.entries / key).is_dir():
            return None
        return self.manifest_of(key)

    # -- what the CLI and the warm pool use ------------------------------------------------
    def ls(self) -> list[EntryInfo]:
        if not self.entries.is_dir():
            return []
        infos = [self._read_entry(d.name) for d in sorted(self.entries.iterdir())]
        return sorted((i for i in infos if i is not None), key=lambda i: -i.last_used_s)

    def last_key(self, uri: str) -> str | None:
        """The key `uri` resolved to last, if its entry is still here."""
        path = self.index / (hashlib.sha256(uri.encode()).hexdigest()[:32] + ".json")
        try:
            key = json.loads(path.read_text())["key"]
        except FileNotFoundError:
            return None
        return key if (self.entries / key).is_dir() else None

    def manifest_of(self, key: str) -> Manifest:
        path = self.entries / key / _ENTRY
        return parse_manifest(json.dumps(json.loads(path.read_text())["manifest"]), str(path))

    def find(self, target: str) -> str | None:
        """A key from a key, a unique key prefix (6+ characters) or a source URI."""
        keys = [d.name for d in self.entries.iterdir()] if self.entries.is_dir() else []
        if target in keys:
            return target
        hits = [k for k in keys if len(target) >= 6 and k.startswith(target)]
        return hits[0] if len(hits) == 1 else self.last_key(target)

    def evict(self, key: str, *, force: bool = False) -> EntryInfo:
        """Remove one entry now. Refused while a replica holds a lease; a pinned entry only with
        `force` (which also unpins it)."""
        with self._root_lock():
            info = self._read_entry(key)
            if info is None:
                raise WeightCacheError(f"no entry {key} in {self.root}")
            if info.pinned and not force:
                raise EntryBusy(f"{key} ({info.source}) is pinned for the warm pool; unpin it or force")
            lease = try_lock(self.locks / f"{key}.lease", exclusive=True)
            if lease is None:
                raise EntryBusy(f"{key} ({info.source}) is in use: a running process holds its lease")
            with lease:
                self._remove_locked(key)
            return info

    def pin(self, key: str) -> None:
        self._dirs()
        (self.pins / key).touch()

    def unpin(self, key: str) -> None:
        (self.pins / key).unlink(missing_ok=True)


def _release(held: dict[str, HeldLock | None]) -> None:
    for h in held.values():
        if h is not None:
            h.release()


def _touch(path: Path) -> None:
    # Explicit nanoseconds: the kernel's own stamp is jiffy-coarse, and two uses in one tick
    # would tie in the LRU order.
    now = time.time_ns()
    os.utime(path, ns=(now, now))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
