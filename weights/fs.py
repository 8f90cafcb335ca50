"""File-system pieces of the cache: locks that a killed process gives back, and the sink a source
writes a file into (it hashes as it writes, so nothing is read twice, and resumes where a partial
file ends).

Locks are `flock`s on small files: the kernel drops them when the holding process dies, however
it dies, so a `kill -9` mid-fill never leaves a lock held or a lease counted.
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass, field
from pathlib import Path

from hbmserve.weights.errors import ChecksumMismatch, DiskFull, TruncatedDownload
from hbmserve.weights.manifest import FileEntry, Hasher, new_hasher

# The one write call; a test makes the disk "full" by swapping this name (not os.write itself).
_os_write = os.write
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


@dataclass
class HeldLock:
    path: Path
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor drops the flock
            self.fd = None

    def __enter__(self) -> HeldLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _flock(path: Path, flags: int, create: bool = True) -> HeldLock | None:
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o644)
    try:
        fcntl.flock(fd, flags)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return HeldLock(path, fd)


# Lock files are never deleted: a process blocked on a deleted file's lock would wake up holding
# a lock nobody else can see.
def lock(path: Path, *, exclusive: bool) -> HeldLock:
    """An flock on `path` (created if missing), waiting for it."""
    held = _flock(path, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    if held is None:  # only a non-blocking flock reports "would block"
        raise RuntimeError(f"flock on {path} returned without the lock")
    return held


def try_lock(path: Path, *, exclusive: bool) -> HeldLock | None:
    """An flock on `path` if nobody holds a conflicting one now; None otherwise."""
    return _flock(path, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)


def is_locked(path: Path) -> bool:
    """Whether any process holds an flock on `path` (probed with a non-blocking exclusive lock;
    a missing file is not created, so a probe never resurrects a lock file someone removed)."""
    try:
        held = _flock(path, fcntl.LOCK_EX | fcntl.LOCK_NB, create=False)
    except FileNotFoundError:
        return False
    if held is None:
        return True
    held.release()
    return False


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Sink:
    """The file `entry` is being written to. `size` and the running digest cover what is on disk,
    bytes from an interrupted earlier attempt included, so a source resumes at `size`."""

    path: Path
    entry: FileEntry
    fd: int
    size: int
    hasher: Hasher = field(repr=False)

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        try:
            while view:
                n = _os_write(self.fd, view)
                self.hasher.update(view[:n])
                self.size += n
                view = view[n:]
        except OSError as e:
            if e.errno in _DISK_FULL:
                raise DiskFull(f"disk full ({errno.errorcode[e.errno]}) writing {self.entry.path} at byte "
                               f"{self.size} of {self.entry.size}") from e
            raise

    def reset(self) -> None:
        """Start the file again (a server that ignored a Range request sends it whole)."""
        os.ftruncate(self.fd, 0)
        self.size, self.hasher = 0, new_hasher(self.entry)

    def adopt(self, path: Path) -> None:
        """Take a file another library downloaded (same file system) as this sink's content,
        hashing it on the way: a rename, not a copy."""
        self.reset()
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(8 * 1024 * 1024):
                self.hasher.update(chunk)
                self.size += len(chunk)
        os.close(self.fd)
        os.replace(path, self.path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def finish(self) -> None:
        """fsync and close, then check size and digest; raises with the file named."""
        os.fsync(self.fd)
        self.close()
        if self.size < self.entry.size:
            raise TruncatedDownload(f"{self.entry.path}: got {self.size} of {self.entry.size} bytes")
        if self.size > self.entry.size:
            raise ChecksumMismatch(f"{self.entry.path}: got {self.size} bytes, the manifest says {self.entry.size}")
        got = f"{self.entry.algorithm}:{self.hasher.hexdigest()}"
        if got != self.entry.digest:
            raise ChecksumMismatch(f"{self.entry.path}: {got} does not match the manifest's {self.entry.digest}")


def open_sink(path: Path, entry: FileEntry) -> Sink:
    """Open (or reopen, to resume) `path` for appending; hashes whatever it already holds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    hasher, size = new_hasher(entry), 0
    while chunk := os.pread(fd, 8 * 1024 * 1024, size):
        hasher.update(chunk)
        size += len(chunk)
    return Sink(path, entry, fd, size, hasher)
